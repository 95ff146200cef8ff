//! Certificate, CRL and PEM parsing, and the AMD VCEK extension readers.
#![no_main]

use inferno_attestation::abi::snp::Product;
use inferno_attestation::pki;
use inferno_attestation::verify::snp::{certified_tcb, hw_id, product_name};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cert) = pki::parse_certificate(data, "fuzz") {
        let _ = hw_id(&cert);
        let _ = product_name(&cert);
        let _ = certified_tcb(&cert, Product::Milan);
        let _ = certified_tcb(&cert, Product::Turin);
        let _ = pki::verify_issued_by(&cert, &cert, "fuzz");
    }
    let _ = pki::parse_crl(data, "fuzz");
    let _ = pki::pem_blocks(data, "fuzz");
});
