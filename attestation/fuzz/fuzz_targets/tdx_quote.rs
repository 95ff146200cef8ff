//! TDX quote header detection and dcap-qvl's quote parser.
#![no_main]

use inferno_attestation::abi::tdx;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tdx::looks_like_quote(data);
    if let Ok(quote) = dcap_qvl::quote::Quote::parse(data) {
        let _ = dcap_qvl::intel::quote_fmspc(&quote);
    }
});
