//! The AMD KDS paths `fetch` derives from real SNP reports of `../shared/attestation-vectors`
//! (README values: chip, product, REPORTED_TCB); skips loudly without them.
#![cfg(feature = "fetch")]

use std::path::PathBuf;

use inferno_attestation::abi::snp::{Product, SnpReport};
use inferno_attestation::fetch::FetchError;
use inferno_attestation::fetch::amd::KdsPaths;

fn vector(name: &str) -> Option<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/attestation-vectors/sev-snp")
        .join(name);
    match std::fs::read(&path) {
        Ok(bytes) => Some(bytes),
        Err(_) => {
            eprintln!("SKIPPED: {} is absent", path.display());
            None
        }
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn a_version_2_milan_report_needs_its_product_named() {
    let Some(text) = vector("virtee-sev/report_milan.hex") else {
        return;
    };
    let bytes = hex::decode(String::from_utf8(text).unwrap().trim()).unwrap();
    let report = SnpReport::parse(&bytes).unwrap();
    let err = KdsPaths::for_report(&report, None).unwrap_err();
    assert!(
        matches!(&err, FetchError::Evidence(m) if m.contains("--amd-product")),
        "{err}"
    );
    let paths = KdsPaths::for_report(&report, Some(Product::Milan)).unwrap();
    let chip = hex::encode(report.chip_id());
    assert_eq!(
        paths.vcek,
        format!("vcek/v1/Milan/{chip}?blSPL=03&teeSPL=00&snpSPL=08&ucodeSPL=115")
    );
    assert_eq!(paths.cert_chain, "vcek/v1/Milan/cert_chain");
    assert_eq!(paths.crl, "vcek/v1/Milan/crl");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn a_turin_report_names_its_product_and_uses_the_8_byte_hwid_and_fmc_spl() {
    let Some(bytes) = vector("project-oak/turin_report.bin") else {
        return;
    };
    let report = SnpReport::parse(&bytes).unwrap();
    // CPUID names Turin, whatever the caller says.
    let paths = KdsPaths::for_report(&report, Some(Product::Milan)).unwrap();
    let hwid = hex::encode(&report.chip_id()[..8]);
    assert_eq!(
        paths.vcek,
        format!("vcek/v1/Turin/{hwid}?fmcSPL=00&blSPL=01&teeSPL=00&snpSPL=02&ucodeSPL=71")
    );
}
