//! Property tests: the TPM parsers reject or accept arbitrary bytes without panicking, and a
//! parsed quote's PCR selection stays within the 32 PCRs a 4-byte bitmap can name.

use inferno_attestation::tpm::{
    AkKey, Quote, Signature, azure_hcl, check_ak_attributes, eventlog::EventLog, parse_tpmt_public,
};
use proptest::prelude::*;

proptest! {
    #[test]
    fn tpm_structures_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(quote) = Quote::parse(&data) {
            for selection in &quote.selections {
                prop_assert!(selection.pcrs.iter().all(|pcr| *pcr < 32));
            }
        }
        let _ = Signature::parse(&data);
        let _ = parse_tpmt_public(&data);
        let _ = check_ak_attributes(&data);
        let _ = AkKey::from_spki_der(&data);
        let _ = azure_hcl::parse_and_bind(&data);
        let _ = azure_hcl::ak_from_variable_data(&data);
    }

    #[test]
    fn event_log_never_panics(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        if let Ok(log) = EventLog::parse(&data) {
            for bank in &log.banks {
                let _ = log.replay(*bank);
            }
        }
    }

    #[test]
    fn quote_headers_with_random_tails_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..256)
    ) {
        let mut data = vec![0xff, 0x54, 0x43, 0x47, 0x80, 0x18];
        data.extend_from_slice(&tail);
        let _ = Quote::parse(&data);
    }
}

#[test]
fn pcr_text_errors_name_the_line() {
    use inferno_attestation::tpm::{HashAlg, PcrBank, TpmError};
    let ok = PcrBank::from_text(HashAlg::Sha1, "00 00\n\n07 ab\n").unwrap();
    assert_eq!(ok.values.len(), 2);
    for (text, line) in [("00 zz", 1), ("00 00\nx 00", 2), ("00 00\n01", 2)] {
        let err = PcrBank::from_text(HashAlg::Sha1, text).unwrap_err();
        assert!(
            matches!(err, TpmError::PcrText { line: l, .. } if l == line),
            "{text:?}: {err}"
        );
    }
}
