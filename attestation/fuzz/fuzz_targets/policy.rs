//! Policy TOML parser and validation.
#![no_main]

use inferno_attestation::policy::LoadedPolicy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = LoadedPolicy::from_bytes(data) {
        assert!(p.policy.validate().is_ok());
    }
});
