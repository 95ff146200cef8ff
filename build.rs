//! Sets `cfg(shared_vectors)` when `../shared/attestation-vectors` (beside the repository)
//! exists, and `cfg(shared_fixture)` when `../shared/fixtures/tiny-llama3` does: the tests on
//! that data are ignored without it (listed as ignored, with the reason), never counted as passed.

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
}
