//! Collateral bundle parser.
#![no_main]

use inferno_attestation::bundle::CollateralBundle;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = CollateralBundle::from_bytes(data) {
        assert_eq!(CollateralBundle::from_bytes(b.to_json().as_bytes()).ok(), Some(b));
    }
});
