//! Sets `cfg(shared_vectors)` when `../shared/attestation-vectors` (beside the repository)
//! exists, and `cfg(shared_fixture)` when `../shared/fixtures/tiny-llama3` does: the tests on
//! that data are ignored without it (listed as ignored, with the reason), never counted as passed.
//! Likewise `cfg(real_tokenizers)` when `scripts/fetch_real_tokenizers.sh` has put the real Qwen3
//! and Llama 3.1 tokenizers in `tests/real-tokenizers/`, and `cfg(harmony_tokenizer)` when it has
//! built gpt-oss's o200k_harmony tokenizer there.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
    let shared = std::path::Path::new(&manifest).join("../shared");
    for (cfg, dir) in [
        ("shared_vectors", "attestation-vectors"),
        ("shared_fixture", "fixtures/tiny-llama3"),
    ] {
        println!("cargo:rustc-check-cfg=cfg({cfg})");
        let dir = shared.join(dir);
        if dir.is_dir() {
            println!("cargo:rustc-cfg={cfg}");
            println!("cargo:rerun-if-changed={}", dir.display());
        }
    }
    println!("cargo:rustc-check-cfg=cfg(real_tokenizers)");
    let real = std::path::Path::new(&manifest).join("tests/real-tokenizers");
    println!("cargo:rerun-if-changed={}", real.display());
    if ["qwen3", "llama3_1"]
        .iter()
        .all(|name| real.join(name).join("tokenizer.json").is_file())
    {
        println!("cargo:rustc-cfg=real_tokenizers");
    }
    println!("cargo:rustc-check-cfg=cfg(harmony_tokenizer)");
    if real.join("gpt-oss/tokenizer.json").is_file() {
        println!("cargo:rustc-cfg=harmony_tokenizer");
    }
}
