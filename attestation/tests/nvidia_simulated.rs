//! The simulated GPU produces real-format evidence that the real verifier accepts only when
//! the trust names the simulated root, and rejects when it is altered.

use inferno_attestation::nvidia::simulated::{SimulatedGpu, SimulatedGpuConfig, TEST_SEED};
use inferno_attestation::nvidia::{self, GpuError, GpuEvidence, GpuTrust, spdm::SpdmReport};
use time::macros::datetime;

const NONCE: [u8; 32] = [0x42; 32];

fn gpu() -> SimulatedGpu {
    SimulatedGpu::new(TEST_SEED, SimulatedGpuConfig::default()).expect("simulated GPU")
}

fn dev_trust(gpu: &SimulatedGpu) -> GpuTrust {
    GpuTrust {
        simulated_roots: vec![gpu.root_der().to_vec()],
        ..GpuTrust::nvidia().expect("built-in roots")
    }
}

#[test]
fn simulated_evidence_verifies_and_is_marked_simulated() {
    let gpu = gpu();
    let evidence = gpu.evidence(&NONCE).unwrap();
    let claims = nvidia::verify(
        &evidence,
        &dev_trust(&gpu),
        &NONCE,
        datetime!(2026-11-22 0:00 UTC),
    )
    .expect("simulated evidence verifies under the development trust");
    assert!(claims.simulated);
    assert_eq!(claims.driver_version, "550.90.07");
    assert_eq!(claims.vbios_version, "96.00.9F.00.01");
    assert_eq!(claims.measurements.len(), 64);
    assert_eq!(claims.measurements[&7], hex::encode(gpu.measurement(7)));
    assert_eq!(claims.project.as_deref(), Some("SIM0"));
}

#[test]
fn production_trust_rejects_the_simulated_root() {
    let gpu = gpu();
    let evidence = gpu.evidence(&NONCE).unwrap();
    let err = nvidia::verify(
        &evidence,
        &GpuTrust::nvidia().unwrap(),
        &NONCE,
        datetime!(2026-11-22 0:00 UTC),
    )
    .unwrap_err();
    assert!(matches!(err, GpuError::CertChain { .. }), "{err}");
}

#[test]
fn the_same_seed_gives_the_same_root_and_another_seed_does_not() {
    assert_eq!(gpu().root_der(), gpu().root_der());
    let other = SimulatedGpu::new(b"another seed", SimulatedGpuConfig::default()).unwrap();
    assert_ne!(gpu().root_der(), other.root_der());
    // A report signed by another device under the trusted chain does not verify.
    let gpu = gpu();
    let mut evidence = other.evidence(&NONCE).unwrap();
    evidence.cert_chain = gpu.evidence(&NONCE).unwrap().cert_chain;
    let err = nvidia::verify(
        &evidence,
        &dev_trust(&gpu),
        &NONCE,
        datetime!(2026-11-22 0:00 UTC),
    )
    .unwrap_err();
    assert!(matches!(err, GpuError::BadSignature), "{err}");
}

#[test]
fn a_flipped_bit_anywhere_in_the_report_is_caught() {
    let gpu = gpu();
    let trust = dev_trust(&gpu);
    let evidence = gpu.evidence(&NONCE).unwrap();
    let signed_len = SpdmReport::parse(&evidence.report).unwrap().signed.len();
    // Every 7th byte across request, blocks, nonce, opaque data and signature.
    for at in (0..evidence.report.len()).step_by(7) {
        let mut broken = evidence.clone();
        broken.report[at] ^= 0x01;
        assert!(
            nvidia::verify(&broken, &trust, &NONCE, datetime!(2026-11-22 0:00 UTC)).is_err(),
            "flip at byte {at} (signed part is {signed_len} bytes) was accepted"
        );
    }
}

#[test]
fn wrong_nonce_truncation_and_early_clock_fail() {
    let gpu = gpu();
    let trust = dev_trust(&gpu);
    let evidence = gpu.evidence(&NONCE).unwrap();
    let now = datetime!(2026-11-22 0:00 UTC);
    let err = nvidia::verify(&evidence, &trust, &[0x43; 32], now).unwrap_err();
    assert!(matches!(err, GpuError::NonceMismatch { .. }), "{err}");
    let mut short = evidence.clone();
    short.report.truncate(short.report.len() - 1);
    let err = nvidia::verify(&short, &trust, &NONCE, now).unwrap_err();
    assert!(
        matches!(
            err,
            GpuError::Spdm {
                field: "Signature",
                ..
            }
        ),
        "{err}"
    );
    let err =
        nvidia::verify(&evidence, &trust, &NONCE, datetime!(2023-06-01 0:00 UTC)).unwrap_err();
    assert!(err.to_string().contains("not valid at"), "{err}");
    let mut no_leaf = evidence.clone();
    no_leaf.cert_chain.remove(0);
    let err = nvidia::verify(&no_leaf, &trust, &NONCE, now).unwrap_err();
    assert!(matches!(err, GpuError::CertChain { .. }), "{err}");
}

#[test]
fn evidence_round_trips_through_json() {
    let evidence = gpu().evidence(&NONCE).unwrap();
    let json = serde_json::to_string(&evidence).unwrap();
    let back: GpuEvidence = serde_json::from_str(&json).unwrap();
    assert_eq!(back, evidence);
}

/// A RIM whose active golden values are the simulated GPU's measurements `range`.
fn rim_for(
    gpu: &SimulatedGpu,
    version: &str,
    range: std::ops::RangeInclusive<u8>,
) -> nvidia::rim::ParsedRim {
    nvidia::rim::ParsedRim {
        tag_id: format!("sim-{version}"),
        version: version.into(),
        golden: (0..64)
            .map(|index| nvidia::rim::Golden {
                index,
                active: range.contains(&index),
                alternatives: vec![vec![0xee; 48], gpu.measurement(index + 1).to_vec()],
            })
            .collect(),
        signer_chain: Vec::new(),
    }
}

#[test]
fn golden_measurements_are_compared_block_by_block() {
    let gpu = gpu();
    let evidence = gpu.evidence(&NONCE).unwrap();
    let report = SpdmReport::parse(&evidence.report).unwrap();
    let driver = rim_for(&gpu, "550.90.07", 10..=40);
    let vbios = rim_for(&gpu, "96.00.9f.00.01", 0..=9);
    let matched = nvidia::compare_reference_values(
        &driver,
        &vbios,
        &report.blocks,
        "550.90.07",
        "96.00.9F.00.01",
    )
    .expect("golden values match");
    assert_eq!(matched.compared, 41);

    let mut wrong = driver.clone();
    wrong.golden[20].alternatives = vec![vec![0u8; 48]];
    let err = nvidia::compare_reference_values(
        &wrong,
        &vbios,
        &report.blocks,
        "550.90.07",
        "96.00.9F.00.01",
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            GpuError::MeasurementMismatch {
                index: 21,
                rim: "driver"
            }
        ),
        "{err}"
    );

    let overlapping = rim_for(&gpu, "96.00.9f.00.01", 0..=10);
    let err = nvidia::compare_reference_values(
        &driver,
        &overlapping,
        &report.blocks,
        "550.90.07",
        "96.00.9F.00.01",
    )
    .unwrap_err();
    assert!(err.to_string().contains("active in both"), "{err}");

    let err = nvidia::compare_reference_values(
        &driver,
        &vbios,
        &report.blocks,
        "550.90.07",
        "96.00.9F.00.02",
    )
    .unwrap_err();
    assert!(
        matches!(err, GpuError::RimVersionMismatch { kind: "VBIOS", .. }),
        "{err}"
    );
}
