//! The whole SNP verification and appraisal path on arbitrary report bytes with the simulated
//! certificate chain: never panics, and never passes (the fuzzer cannot forge the signature).
#![no_main]

use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::collect::simulated::{ARK_DER, ASK_DER, VCEK_DER};
use inferno_attestation::evidence::{Base64Bytes, Evidence, SnpCert, SnpCertKind, SnpEvidence};
use inferno_attestation::policy::{LoadedPolicy, Platform};
use libfuzzer_sys::fuzz_target;

const DEV_POLICY: &[u8] = include_bytes!("../../../policy/development.toml");

fuzz_target!(|data: &[u8]| {
    let Ok(policy) = LoadedPolicy::from_bytes(DEV_POLICY) else {
        return;
    };
    let cert = |kind, der: &[u8]| SnpCert { kind, der: Base64Bytes(der.to_vec()) };
    let evidence = Evidence {
        version: 1,
        platform: Platform::SevSnp,
        runtime_data: None,
        sev_snp: Some(SnpEvidence {
            report: Base64Bytes(data.to_vec()),
            certs: vec![
                cert(SnpCertKind::Vcek, VCEK_DER),
                cert(SnpCertKind::Ask, ASK_DER),
                cert(SnpCertKind::Ark, ARK_DER),
            ],
            hcl_report: None,
        }),
        tdx: None,
        tpm: None,
        gpu: None,
    };
    let report = appraise(&AppraisalInput {
        evidence: &evidence,
        policy: &policy,
        collateral: None,
        now: time::OffsetDateTime::from_unix_timestamp(1_767_225_600).unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
        clock_floor: None,
        gpu_ready_pending: false,
    });
    assert!(!report.passed());
});
