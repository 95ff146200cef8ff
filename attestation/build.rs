//! Builds the libxmlsec1 shim for RIM XML-DSig verification (feature `rim-xmlsec`), and sets
//! `cfg(shared_vectors)` when `../shared/attestation-vectors` (beside the repository) exists:
//! tests on those vectors are ignored without it, never counted as passed.

fn main() {
    println!("cargo:rerun-if-changed=src/nvidia/xmlsec_shim.c");
    println!("cargo:rustc-check-cfg=cfg(shared_vectors)");
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
    let vectors = std::path::Path::new(&manifest).join("../../shared/attestation-vectors");
    if vectors.is_dir() {
        println!("cargo:rustc-cfg=shared_vectors");
        println!("cargo:rerun-if-changed={}", vectors.display());
    }
    if std::env::var_os("CARGO_FEATURE_RIM_XMLSEC").is_none() {
        return;
    }
    let lib = match pkg_config::Config::new().probe("xmlsec1-openssl") {
        Ok(lib) => lib,
        Err(e) => {
            panic!("feature rim-xmlsec needs libxmlsec1-dev (pkg-config xmlsec1-openssl): {e}")
        }
    };
    let mut build = cc::Build::new();
    build.file("src/nvidia/xmlsec_shim.c");
    for path in &lib.include_paths {
        build.include(path);
    }
    for (name, value) in &lib.defines {
        build.define(name, value.as_deref());
    }
    build.compile("inferno_xmlsec_shim");
    for lib_name in &lib.libs {
        println!("cargo:rustc-link-lib={lib_name}");
    }
}
