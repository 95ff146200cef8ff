//! SNP report parser: any input either fails cleanly or yields consistent accessors.
#![no_main]

use inferno_attestation::abi::snp::{Product, REPORT_LEN, SnpReport};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = SnpReport::parse(data) {
        assert_eq!(data.len(), REPORT_LEN);
        assert!((2..=5).contains(&report.version()));
        let _ = report.signing_key();
        let _ = report.signature_p1363();
        let _ = report.product_from_cpuid();
        for product in [Product::Milan, Product::Genoa, Product::Turin] {
            let tcb = product.decode_tcb(report.reported_tcb_raw());
            assert_eq!(product.decode_tcb(product.encode_tcb(&tcb)), tcb);
        }
    }
});
