//! Sets `cfg(shared_vectors)` when `../shared/attestation-vectors` (beside the repository)
//! exists: the CLI tests on those vectors are ignored without it, never counted as passed.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(shared_vectors)");
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
    let vectors = std::path::Path::new(&manifest).join("../shared/attestation-vectors");
    if vectors.is_dir() {
        println!("cargo:rustc-cfg=shared_vectors");
        println!("cargo:rerun-if-changed={}", vectors.display());
    }
}
