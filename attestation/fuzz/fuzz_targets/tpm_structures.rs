//! TPM quote, signature, public-key and Azure HCL parsers: any input fails cleanly or parses.
#![no_main]

use inferno_attestation::tpm::{
    AkKey, Quote, Signature, azure_hcl, check_ak_attributes, parse_tpmt_public,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(quote) = Quote::parse(data) {
        for selection in &quote.selections {
            assert!(selection.pcrs.iter().all(|pcr| *pcr < 32));
        }
    }
    let _ = Signature::parse(data);
    if let Ok(key) = parse_tpmt_public(data) {
        let _ = check_ak_attributes(data);
        if let Ok(der) = key.to_spki_der() {
            let back = AkKey::from_spki_der(&der).expect("own SPKI encoding parses");
            assert_eq!(back.spki_sha256().ok(), key.spki_sha256().ok());
        }
    }
    let _ = AkKey::from_spki_der(data);
    let _ = azure_hcl::parse_and_bind(data);
    let _ = azure_hcl::ak_from_variable_data(data);
});
