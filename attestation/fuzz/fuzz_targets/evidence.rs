//! Evidence envelope and raw-evidence detection.
#![no_main]

use inferno_attestation::evidence::Evidence;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(evidence) = Evidence::from_bytes(data) {
        let json = evidence.to_json();
        assert_eq!(Evidence::from_bytes(json.as_bytes()).ok(), Some(evidence));
    }
});
