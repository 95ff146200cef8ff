//! Property tests: the SPDM, opaque-data and RIM parsers never panic, and a parsed report's
//! signed part, signature and trailing bytes always partition the input.

use inferno_attestation::nvidia::opaque::OpaqueData;
use inferno_attestation::nvidia::rim::{ParsedRim, RimKind};
use inferno_attestation::nvidia::simulated::{SimulatedGpu, SimulatedGpuConfig, TEST_SEED};
use inferno_attestation::nvidia::spdm::{SIGNATURE_LEN, SpdmReport};
use proptest::prelude::*;

/// One simulated report, built once.
fn simulated_report() -> &'static [u8] {
    static REPORT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    REPORT.get_or_init(|| {
        let gpu = SimulatedGpu::new(TEST_SEED, SimulatedGpuConfig::default()).unwrap();
        gpu.evidence(&[7; 32]).unwrap().report
    })
}

proptest! {
    #[test]
    fn spdm_and_opaque_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        if let Ok(report) = SpdmReport::parse(&data) {
            prop_assert_eq!(report.signed.len() + SIGNATURE_LEN + report.trailing, data.len());
        }
        if let Ok(opaque) = OpaqueData::parse(&data) {
            let _ = opaque.driver_version();
            let _ = opaque.vbios_version();
            let _ = opaque.fwid();
        }
    }

    #[test]
    fn rim_parser_never_panics(text in "\\PC{0,512}") {
        let _ = ParsedRim::parse(text.as_bytes(), RimKind::Vbios);
    }

    #[test]
    fn mutated_simulated_reports_parse_or_fail_cleanly(
        at in 0usize..4000,
        value in any::<u8>(),
        cut in 0usize..4000,
    ) {
        let mut report = simulated_report().to_vec();
        let len = report.len();
        report[at % len] = value;
        report.truncate(len - cut % len);
        if let Ok(parsed) = SpdmReport::parse(&report) {
            prop_assert_eq!(parsed.signed.len() + SIGNATURE_LEN + parsed.trailing, report.len());
        }
    }
}
