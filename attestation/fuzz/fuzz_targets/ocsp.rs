//! OCSP responses: DER parsing, then CertID matching, signer and freshness checks against the
//! simulated GPU hierarchy (device → ICA → root).
#![no_main]

use std::sync::OnceLock;

use inferno_attestation::nvidia::simulated::{SimulatedGpu, SimulatedGpuConfig, TEST_SEED};
use inferno_attestation::ocsp::OcspResponses;
use inferno_attestation::pki;
use libfuzzer_sys::fuzz_target;
use time::{Duration, OffsetDateTime};

/// The simulated hierarchy, built once (key derivation is too slow to repeat per input).
fn chain() -> &'static [Vec<u8>] {
    static CHAIN: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    CHAIN.get_or_init(|| {
        SimulatedGpu::new(TEST_SEED, SimulatedGpuConfig::default())
            .expect("simulated GPU")
            .chain()
            .to_vec()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(responses) = OcspResponses::parse([("fuzz", data)]) else {
        return;
    };
    let now = OffsetDateTime::UNIX_EPOCH + Duration::days(20_454);
    for pair in chain().windows(2) {
        let (Ok(cert), Ok(issuer)) = (
            pki::parse_certificate(&pair[0], "certificate"),
            pki::parse_certificate(&pair[1], "issuer"),
        ) else {
            continue;
        };
        let _ = responses.status(&cert, &issuer, now, Duration::days(7), "fuzz");
    }
});
