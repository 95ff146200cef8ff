//! SNP certificate table (host-controlled auxblob): never panics, entries stay in bounds.
#![no_main]

use inferno_attestation::abi::snp_certs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = snp_certs::parse(data) {
        for e in &entries {
            assert!(e.data.len() <= data.len());
        }
        let pairs: Vec<([u8; 16], &[u8])> = entries.iter().map(|e| (e.guid, e.data.as_slice())).collect();
        let again = snp_certs::serialise(&pairs);
        assert_eq!(snp_certs::parse(&again).map(|v| v.len()), Ok(entries.len()));
    }
});
