//! SPDM measurement report and NVIDIA opaque-data parsers: any input fails cleanly or yields a
//! report whose signed part and signature lie inside the input.
#![no_main]

use inferno_attestation::nvidia::opaque::OpaqueData;
use inferno_attestation::nvidia::spdm::{SIGNATURE_LEN, SpdmReport};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = SpdmReport::parse(data) {
        assert_eq!(report.signature.len(), SIGNATURE_LEN);
        assert_eq!(
            report.signed.len() + SIGNATURE_LEN + report.trailing,
            data.len()
        );
        if let Ok(opaque) = OpaqueData::parse(report.opaque) {
            let _ = opaque.driver_version();
            let _ = opaque.vbios_version();
            let _ = opaque.fwid();
        }
    }
    if let Ok(opaque) = OpaqueData::parse(data) {
        let _ = opaque.driver_version();
        let _ = opaque.vbios_version();
    }
});
