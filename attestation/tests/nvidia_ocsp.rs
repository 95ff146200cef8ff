//! OCSP for the GPU certificate chain, offline: responses built for the simulated GPU
//! hierarchy (RFC 6960 DER, signed with its P-384 keys) travel in the collateral bundle and the
//! appraisal's `gpu.ocsp` check judges them: good, revoked, stale, wrong signer, wrong
//! certificate, missing, malformed.

use std::path::PathBuf;

use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::bundle::{CollateralBundle, NamedBlob};
use inferno_attestation::collect::collect_evidence;
use inferno_attestation::collect::simulated::SimulatedSnp;
use inferno_attestation::evidence::{Base64Bytes, Evidence};
use inferno_attestation::nvidia::simulated::{
    SimulatedCert, SimulatedGpu, SimulatedGpuConfig, SimulatedOcsp, TEST_SEED,
};
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::report::{AppraisalReport, Check};
use inferno_attestation::runtime_data::RuntimeData;
use time::macros::datetime;
use time::{Duration, OffsetDateTime};
use x509_cert::ext::pkix::CrlReason;

const NOW: OffsetDateTime = datetime!(2026-01-01 0:00 UTC);

/// The development policy, with `require_ocsp` as given.
fn policy(require_ocsp: bool) -> LoadedPolicy {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policy/development.toml"),
    )
    .unwrap();
    assert!(text.contains("require_ocsp = false"));
    let text = text.replace(
        "require_ocsp = false",
        &format!("require_ocsp = {require_ocsp}"),
    );
    LoadedPolicy::from_bytes(text.as_bytes()).unwrap()
}

fn gpu() -> SimulatedGpu {
    SimulatedGpu::new(TEST_SEED, SimulatedGpuConfig::default()).unwrap()
}

/// A good response for the ICA, signed by its issuer (the root), fresh at [`NOW`].
fn good_ica() -> SimulatedOcsp {
    SimulatedOcsp {
        subject: SimulatedCert::Ica,
        revoked: None,
        this_update: NOW - Duration::days(1),
        next_update: NOW + Duration::days(6),
        signer: SimulatedCert::Root,
    }
}

/// Appraises simulated SNP + GPU evidence with `responses` in the bundle.
fn judge(policy: &LoadedPolicy, responses: Vec<Vec<u8>>) -> AppraisalReport {
    let mut doc = RuntimeData::new(policy.digest, "inferno/test");
    doc.set_challenge_bindings([[3u8; 32]]).unwrap();
    let mut evidence: Evidence = collect_evidence(&SimulatedSnp::new().unwrap(), &doc).unwrap();
    evidence.gpu = Some(gpu().evidence(&doc.gpu_nonce()).unwrap());
    let mut bundle = CollateralBundle::empty("2026-01-01T00:00:00Z".into());
    bundle.nvidia.ocsp = responses
        .into_iter()
        .enumerate()
        .map(|(i, der)| NamedBlob {
            name: format!("response-{i}.der"),
            data: Base64Bytes(der),
        })
        .collect();
    appraise(&AppraisalInput {
        evidence: &evidence,
        policy,
        collateral: Some(&bundle),
        now: NOW,
        clock_floor: None,
        gpu_ready_pending: true,
    })
}

fn ocsp_check(report: &AppraisalReport) -> &Check {
    report
        .checks
        .iter()
        .find(|c| c.id == "gpu.ocsp")
        .unwrap_or_else(|| panic!("no gpu.ocsp check: {report}"))
}

/// Asserts that `gpu.ocsp` is the only failure and its reason contains every `needle`.
fn assert_rejected(report: &AppraisalReport, needles: &[&str]) {
    let failed: Vec<&str> = report.failures().map(|c| c.id.as_str()).collect();
    assert_eq!(failed, ["gpu.ocsp"], "{report}");
    let reason = &ocsp_check(report).reason;
    for needle in needles {
        assert!(reason.contains(needle), "{needle:?} not in {reason}");
    }
}

#[test]
fn a_good_fresh_response_by_the_issuer_passes_when_required() {
    let g = gpu();
    let report = judge(&policy(true), vec![g.ocsp_response(&good_ica()).unwrap()]);
    assert!(report.passed(), "{report}");
    let check = ocsp_check(&report);
    assert!(
        check.reason.starts_with("1 certificate(s)"),
        "{}",
        check.reason
    );
}

#[test]
fn required_without_a_response_is_rejected() {
    let report = judge(&policy(true), Vec::new());
    assert_rejected(
        &report,
        &["GPU device chain certificate 1", "no OCSP response"],
    );
    // Not required: passes and says so.
    let report = judge(&policy(false), Vec::new());
    assert!(report.passed(), "{report}");
    assert!(ocsp_check(&report).reason.contains("does not require"));
}

#[test]
fn revoked_is_rejected_with_its_reason_even_when_not_required() {
    let g = gpu();
    let revoked = SimulatedOcsp {
        revoked: Some(CrlReason::KeyCompromise),
        ..good_ica()
    };
    let response = g.ocsp_response(&revoked).unwrap();
    for required in [true, false] {
        let report = judge(&policy(required), vec![response.clone()]);
        assert_rejected(&report, &["revoked at 2025-12-31", "KeyCompromise"]);
    }
}

#[test]
fn a_response_stale_past_the_grace_or_from_the_future_is_rejected() {
    let g = gpu();
    // The development policy's grace is 30 days past nextUpdate.
    let stale = SimulatedOcsp {
        this_update: NOW - Duration::days(60),
        next_update: NOW - Duration::days(31),
        ..good_ica()
    };
    let report = judge(&policy(true), vec![g.ocsp_response(&stale).unwrap()]);
    assert_rejected(&report, &["expired", "next update 2025-12-01"]);
    // Within the grace it is still accepted.
    let late = SimulatedOcsp {
        next_update: NOW - Duration::days(29),
        ..stale
    };
    let report = judge(&policy(true), vec![g.ocsp_response(&late).unwrap()]);
    assert!(report.passed(), "{report}");
    let future = SimulatedOcsp {
        this_update: NOW + Duration::days(1),
        next_update: NOW + Duration::days(8),
        ..good_ica()
    };
    let report = judge(&policy(true), vec![g.ocsp_response(&future).unwrap()]);
    assert_rejected(&report, &["not valid before 2026-01-02"]);
}

#[test]
fn a_response_signed_by_anyone_but_the_issuer_is_rejected() {
    let g = gpu();
    // The device key is no delegated responder of the root: wrong issuer, no OCSPSigning.
    let by_device = SimulatedOcsp {
        signer: SimulatedCert::Device,
        ..good_ica()
    };
    let report = judge(&policy(true), vec![g.ocsp_response(&by_device).unwrap()]);
    assert_rejected(
        &report,
        &[
            "not signed by the issuer or its delegated responder",
            "delegated OCSP responder",
        ],
    );
    // The issuer's name but another key: the signature does not verify.
    let mut forged = g.ocsp_response(&good_ica()).unwrap();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    let report = judge(&policy(true), vec![forged]);
    assert_rejected(&report, &["signature does not verify"]);
}

#[test]
fn a_response_for_another_certificate_does_not_cover_the_chain() {
    let g = gpu();
    let for_device = SimulatedOcsp {
        subject: SimulatedCert::Device,
        signer: SimulatedCert::Ica,
        ..good_ica()
    };
    let response = g.ocsp_response(&for_device).unwrap();
    let report = judge(&policy(true), vec![response.clone()]);
    assert_rejected(
        &report,
        &["GPU device chain certificate 1", "no OCSP response"],
    );
    // With the right response as well, the extra one is harmless.
    let report = judge(
        &policy(true),
        vec![response, g.ocsp_response(&good_ica()).unwrap()],
    );
    assert!(report.passed(), "{report}");
}

#[test]
fn a_malformed_response_is_named() {
    let report = judge(&policy(false), vec![b"not DER".to_vec()]);
    assert_rejected(&report, &["OCSP response response-0.der", "not DER OCSP"]);
}

#[test]
#[cfg_attr(not(shared_vectors), ignore = "needs ../shared/attestation-vectors")]
fn a_real_rim_signing_chain_is_checked_from_its_signer_and_missing_responses_are_named() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/attestation-vectors/nvidia-h100/nvtrust/1010_0200_882_96005E0001_PROD.swidtag");
    if !path.is_file() {
        eprintln!("SKIPPED: {} is absent", path.display());
        return;
    }
    use inferno_attestation::nvidia::rim::{ParsedRim, RimKind};
    use inferno_attestation::ocsp::{OcspError, OcspResponses, check_chain};
    let xml = std::fs::read(&path).unwrap();
    let rim = ParsedRim::parse(&xml, RimKind::Vbios).unwrap();
    assert!(rim.signer_chain.len() >= 2, "a signer and its issuer");
    let outcomes = check_chain(
        &OcspResponses::default(),
        &rim.signer_chain,
        0,
        NOW,
        Duration::days(30),
        "VBIOS RIM signing chain",
    )
    .unwrap();
    assert_eq!(outcomes.len(), rim.signer_chain.len() - 1);
    assert!(
        outcomes[0]
            .what
            .starts_with("VBIOS RIM signing chain certificate 0")
    );
    for outcome in &outcomes {
        assert!(
            matches!(outcome.status, Err(OcspError::Missing { .. })),
            "{outcome:?}"
        );
    }
}
