//! Builds the libxmlsec1 shim for RIM XML-DSig verification (feature `rim-xmlsec`).

fn main() {
    println!("cargo:rerun-if-changed=src/nvidia/xmlsec_shim.c");
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
