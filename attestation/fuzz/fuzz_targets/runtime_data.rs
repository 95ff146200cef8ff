//! Runtime-data document: accepted input is exactly its own canonical form.
#![no_main]

use inferno_attestation::runtime_data::RuntimeData;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(doc) = RuntimeData::from_canonical_bytes(data) {
        assert_eq!(doc.to_canonical_bytes(), data);
    }
});
