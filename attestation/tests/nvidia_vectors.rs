//! NVIDIA GPU verifier against the shared real H100 vectors and broken copies of them.

use std::path::{Path, PathBuf};

use inferno_attestation::nvidia::{
    self, CcMode, GpuError, GpuEvidence, GpuTrust, certs::pem_chain, rim::Rim, rim::RimKind,
    spdm::SpdmReport,
};
use time::macros::datetime;

fn vectors() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/attestation-vectors");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: {} is absent", dir.display());
        None
    }
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

fn hex_file(dir: &Path, name: &str) -> Vec<u8> {
    let text = String::from_utf8(read(dir, name)).unwrap();
    hex::decode(text.trim()).unwrap()
}

const NONCE: &str = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb";

fn hopper(dir: &Path) -> GpuEvidence {
    GpuEvidence {
        report: hex_file(dir, "nvidia-h100/nvtrust/hopperAttestationReport.txt"),
        cert_chain: pem_chain(
            &read(dir, "nvidia-h100/nvtrust/hopperCertChain.txt"),
            "device",
        )
        .unwrap(),
        cc_mode: CcMode::On,
        ready_state: true,
    }
}

fn nonce() -> Vec<u8> {
    hex::decode(NONCE).unwrap()
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn hopper_report_verifies_with_expected_claims() {
    let Some(dir) = vectors() else { return };
    let trust = GpuTrust::nvidia().unwrap();
    let claims = nvidia::verify(
        &hopper(&dir),
        &trust,
        &nonce(),
        datetime!(2025-01-01 0:00 UTC),
    )
    .expect("hopper report verifies");
    assert!(!claims.simulated);
    assert_eq!(claims.nonce, NONCE);
    assert_eq!(claims.measurements.len(), 64);
    assert_eq!(claims.driver_version, "550.90.07");
    assert_eq!(claims.vbios_version, "96.00.9F.00.01");
    assert_eq!(claims.reference_values, None);
    // Cross-check every claim with the independently produced trustee claims.
    let expected: serde_json::Value = serde_json::from_slice(&read(
        &dir,
        "nvidia-h100/trustee/hopperAttestationReport-claims.txt",
    ))
    .unwrap();
    assert_eq!(claims.fwid, expected["config"]["fwid"].as_str().unwrap());
    assert_eq!(
        claims.board_id.as_deref(),
        expected["config"]["board_id"].as_str()
    );
    assert_eq!(
        claims.chip_sku.as_deref(),
        expected["config"]["chip_sku"].as_str()
    );
    assert_eq!(
        claims.project.as_deref(),
        expected["config"]["project"].as_str()
    );
    assert_eq!(
        claims.project_sku.as_deref(),
        expected["config"]["project_sku"].as_str()
    );
    for (index, value) in &claims.measurements {
        assert_eq!(
            Some(value.as_str()),
            expected["measurements"][index.to_string()].as_str(),
            "block {index}"
        );
    }
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn negative_vector_fails_the_spdm_signature() {
    let Some(dir) = vectors() else { return };
    let mut evidence = hopper(&dir);
    evidence.report = hex_file(
        &dir,
        "negative/nvidia_hopperAttestationReport_meas1_byte0_xor01.hex",
    );
    let err = nvidia::verify(
        &evidence,
        &GpuTrust::nvidia().unwrap(),
        &nonce(),
        datetime!(2025-01-01 0:00 UTC),
    )
    .unwrap_err();
    assert!(matches!(err, GpuError::BadSignature), "{err}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn broken_chains_fail() {
    let Some(dir) = vectors() else { return };
    let trust = GpuTrust::nvidia().unwrap();
    for case in 2..=4 {
        let mut evidence = hopper(&dir);
        evidence.cert_chain = pem_chain(
            &read(
                &dir,
                &format!("nvidia-h100/trustee/hopper_cert_chain_case{case}.txt"),
            ),
            "device",
        )
        .unwrap();
        let err = nvidia::verify(&evidence, &trust, &nonce(), datetime!(2025-01-01 0:00 UTC))
            .unwrap_err();
        assert!(
            matches!(err, GpuError::CertChain { .. }),
            "case {case}: {err}"
        );
    }
    // Swapped intermediates.
    let mut evidence = hopper(&dir);
    evidence.cert_chain.swap(1, 2);
    let err =
        nvidia::verify(&evidence, &trust, &nonce(), datetime!(2025-01-01 0:00 UTC)).unwrap_err();
    assert!(matches!(err, GpuError::CertChain { .. }), "{err}");
    // A chain under another root.
    let other = GpuTrust {
        device_roots: vec![nvidia::roots::nvidia_rim_root().unwrap()],
        ..GpuTrust::default()
    };
    let err = nvidia::verify(
        &hopper(&dir),
        &other,
        &nonce(),
        datetime!(2025-01-01 0:00 UTC),
    )
    .unwrap_err();
    assert!(matches!(err, GpuError::CertChain { .. }), "{err}");
    // Before the chain's notBefore.
    let err = nvidia::verify(
        &hopper(&dir),
        &trust,
        &nonce(),
        datetime!(2019-01-01 0:00 UTC),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not valid at"), "{err}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn wrong_nonce_and_allow_lists_fail() {
    let Some(dir) = vectors() else { return };
    let now = datetime!(2025-01-01 0:00 UTC);
    let trust = GpuTrust::nvidia().unwrap();
    let err = nvidia::verify(&hopper(&dir), &trust, &[0u8; 32], now).unwrap_err();
    assert!(matches!(err, GpuError::NonceMismatch { .. }), "{err}");
    let strict = GpuTrust {
        allowed_driver_versions: Some(vec!["555.42.02".into()]),
        ..trust.clone()
    };
    let err = nvidia::verify(&hopper(&dir), &strict, &nonce(), now).unwrap_err();
    assert!(
        matches!(err, GpuError::VersionNotAllowed { kind: "driver", .. }),
        "{err}"
    );
    let strict = GpuTrust {
        allowed_driver_versions: Some(vec!["550.90.07".into()]),
        allowed_vbios_versions: Some(vec!["96.00.9f.00.01".into()]),
        ..trust
    };
    nvidia::verify(&hopper(&dir), &strict, &nonce(), now).expect("allowed versions pass");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn trailing_bytes_are_tolerated_and_truncation_is_not() {
    let Some(dir) = vectors() else { return };
    let now = datetime!(2025-01-01 0:00 UTC);
    let trust = GpuTrust::nvidia().unwrap();
    let mut evidence = hopper(&dir);
    evidence.report.extend_from_slice(&[0u8; 7]);
    let claims = nvidia::verify(&evidence, &trust, &nonce(), now).expect("trailing bytes ok");
    assert_eq!(claims.trailing_bytes, 7);
    let full = hopper(&dir).report;
    for len in [0, 36, 37, 45, 1000, full.len() - 96, full.len() - 1] {
        let err = SpdmReport::parse(&full[..len]).unwrap_err();
        assert!(matches!(err, GpuError::Spdm { .. }), "len {len}: {err}");
    }
    // A wrong measurement-record length is caught structurally.
    let mut bad = full.clone();
    bad[37 + 5] ^= 0x01;
    assert!(SpdmReport::parse(&bad).is_err());
}

fn rims(dir: &Path, driver: &str, vbios: &str) -> Vec<Rim> {
    vec![
        Rim {
            kind: RimKind::Driver,
            xml: read(dir, &format!("nvidia-h100/nvtrust/{driver}")),
        },
        Rim {
            kind: RimKind::Vbios,
            xml: read(dir, &format!("nvidia-h100/nvtrust/{vbios}")),
        },
    ]
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
#[cfg(feature = "rim-xmlsec")]
fn rim_signatures_verify_until_the_signer_expires() {
    let Some(dir) = vectors() else { return };
    let roots = vec![nvidia::roots::nvidia_rim_root().unwrap()];
    for (name, kind) in [
        ("1010_0200_882_96005E0001_PROD.swidtag", RimKind::Vbios),
        (
            "1010_0200_882_96005E0001_test_no_gpu.swidtag",
            RimKind::Vbios,
        ),
        ("1010_0200_882_960074001A_PROD.swidtag", RimKind::Vbios),
        ("Driver_RIM_test_no_gpu.swidtag", RimKind::Driver),
    ] {
        let xml = read(&dir, &format!("nvidia-h100/nvtrust/{name}"));
        let rim = nvidia::verify_rim(&xml, kind, &roots, datetime!(2025-01-01 0:00 UTC))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!rim.golden.is_empty(), "{name}");
        // Every signer certificate had expired by 2026 (the README's June 2025 for most).
        let Err(err) = nvidia::verify_rim(&xml, kind, &roots, datetime!(2026-01-01 0:00 UTC))
        else {
            panic!("{name}: accepted with an expired signer");
        };
        assert!(matches!(err, GpuError::CertChain { .. }), "{name}: {err}");
        // One changed golden value breaks the signature.
        let text = String::from_utf8(xml.clone()).unwrap();
        let at = text.find("Hash0=\"").unwrap() + 7;
        let mut edited = xml.clone();
        edited[at] = if edited[at] == b'0' { b'1' } else { b'0' };
        let Err(err) = nvidia::verify_rim(&edited, kind, &roots, datetime!(2025-01-01 0:00 UTC))
        else {
            panic!("{name}: accepted after an edit");
        };
        assert!(matches!(err, GpuError::Rim { .. }), "{name}: {err}");
    }
}

/// The Hopper report verified against NVIDIA's `test_no_gpu` driver and VBIOS RIMs, which must
/// fail (how depends on whether RIM signatures can be checked).
fn verify_with_test_no_gpu_rims(dir: &Path) -> GpuError {
    let trust = GpuTrust {
        rims: rims(
            dir,
            "Driver_RIM_test_no_gpu.swidtag",
            "1010_0200_882_96005E0001_test_no_gpu.swidtag",
        ),
        ..GpuTrust::nvidia().unwrap()
    };
    nvidia::verify(
        &hopper(dir),
        &trust,
        &nonce(),
        datetime!(2025-01-01 0:00 UTC),
    )
    .unwrap_err()
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
#[cfg(not(feature = "rim-xmlsec"))]
fn without_xmlsec_every_rim_is_refused() {
    let Some(dir) = vectors() else { return };
    let err = verify_with_test_no_gpu_rims(&dir);
    assert!(err.to_string().contains("rim-xmlsec"), "{err}");
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
#[cfg(feature = "rim-xmlsec")]
fn test_no_gpu_rims_do_not_match_the_report() {
    let Some(dir) = vectors() else { return };
    let err = verify_with_test_no_gpu_rims(&dir);
    assert!(
        matches!(err, GpuError::RimVersionMismatch { kind: "driver", .. }),
        "{err}"
    );
}
