//! End to end on the simulated TEE: collect → verify → appraise passes under the development
//! policy and is rejected under production; and evidence broken in every way the verifier must
//! notice (bit flips, truncation, wrong chain, swapped or expired certificates, TCB and
//! runtime-data mismatches, clock rollback) is rejected with the right check.

use std::path::PathBuf;

use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::collect::collect_evidence;
use inferno_attestation::collect::simulated::{self, SimulatedSnp};
use inferno_attestation::evidence::{Base64Bytes, Evidence, SnpCertKind};
use inferno_attestation::pki::ClockFloor;
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::report::AppraisalReport;
use inferno_attestation::runtime_data::RuntimeData;
use time::macros::datetime;

const NOW: time::OffsetDateTime = datetime!(2026-01-01 0:00 UTC);

fn policy(name: &str) -> LoadedPolicy {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../policy")
        .join(name);
    LoadedPolicy::from_file(&path).unwrap()
}

fn runtime_data(policy: &LoadedPolicy) -> RuntimeData {
    let mut doc = RuntimeData::new(policy.digest, "inferno/test");
    doc.set_challenge_bindings([[0xAB; 32]]).unwrap();
    doc.tls_spki_sha256 = Some(hex::encode([0x11; 32]));
    doc
}

fn collect(sim: &SimulatedSnp, policy: &LoadedPolicy) -> Evidence {
    collect_evidence(sim, &runtime_data(policy)).unwrap()
}

fn judge(evidence: &Evidence, policy: &LoadedPolicy) -> AppraisalReport {
    appraise(&AppraisalInput {
        evidence,
        policy,
        collateral: None,
        now: NOW,
        clock_floor: None,
        gpu_ready_pending: false,
    })
}

fn failed(r: &AppraisalReport) -> Vec<String> {
    r.failures().map(|c| c.id.clone()).collect()
}

fn report_bytes(e: &mut Evidence) -> &mut Vec<u8> {
    &mut e.sev_snp.as_mut().unwrap().report.0
}

#[test]
fn development_policy_accepts_simulated_evidence_and_says_so() {
    let dev = policy("development.toml");
    assert_eq!(
        dev.policy.simulated.trusted_ark_sha256,
        [simulated::ark_fingerprint()]
    );
    let sim = SimulatedSnp::new().unwrap();
    let evidence = collect(&sim, &dev);
    // The envelope survives a JSON round trip unchanged.
    let evidence = Evidence::from_bytes(evidence.to_json().as_bytes()).unwrap();
    let r = judge(&evidence, &dev);
    assert!(r.passed(), "{r}");
    assert!(r.simulated);
    let text = r.to_string();
    assert!(text.contains("simulated"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["simulated"], true);
    assert_eq!(json["verdict"], "pass");
    assert_eq!(r.policy_sha256, dev.digest_hex());
    let claims = r.claims.runtime_data.as_ref().unwrap();
    assert_eq!(claims.policy_sha256, dev.digest_hex());
    let snp = r.claims.sev_snp.as_ref().unwrap();
    assert_eq!(snp.product, "Milan");
    assert_eq!(snp.report_version, 3);
    assert_eq!(
        snp.measurement,
        hex::encode(simulated::default_measurement())
    );
}

#[test]
fn production_policy_rejects_simulated_evidence() {
    let prod = policy("production.toml");
    let sim = SimulatedSnp::new().unwrap();
    let r = judge(&collect(&sim, &prod), &prod);
    assert!(!r.passed());
    assert!(
        !r.simulated,
        "an untrusted simulated root is not reported as accepted"
    );
    assert!(failed(&r).contains(&"snp.chain".to_owned()), "{r}");
    assert!(r.to_string().contains("simulated evidence"), "{r}");
}

#[test]
fn any_bit_flip_in_the_signed_region_breaks_the_signature() {
    let dev = policy("development.toml");
    let sim = SimulatedSnp::new().unwrap();
    let evidence = collect(&sim, &dev);
    for offset in [0x04, 0x08, 0x30, 0x50, 0x90, 0xC0, 0x180, 0x1A0, 0x29F] {
        let mut e = evidence.clone();
        report_bytes(&mut e)[offset] ^= 0x01;
        let r = judge(&e, &dev);
        assert!(!r.passed(), "flip at {offset:#x} accepted");
        let ids = failed(&r);
        assert!(
            ids.contains(&"snp.report_signature".to_owned()),
            "flip at {offset:#x}: {ids:?}"
        );
    }
    // A flip inside the signature itself.
    let mut e = evidence.clone();
    report_bytes(&mut e)[0x2A0 + 5] ^= 0x80;
    assert_eq!(failed(&judge(&e, &dev)), ["snp.report_signature"]);
    // Non-zero padding above the 48-byte R.
    let mut e = evidence;
    report_bytes(&mut e)[0x2A0 + 60] = 1;
    assert_eq!(failed(&judge(&e, &dev)), ["snp.report_signature"]);
}

#[test]
fn truncated_or_extended_reports_are_format_errors() {
    let dev = policy("development.toml");
    let sim = SimulatedSnp::new().unwrap();
    let evidence = collect(&sim, &dev);
    for len in [0, 1, 0x2A0, 1183] {
        let mut e = evidence.clone();
        report_bytes(&mut e).truncate(len);
        assert_eq!(failed(&judge(&e, &dev)), ["snp.report_format"], "len {len}");
    }
    let mut e = evidence;
    report_bytes(&mut e).push(0);
    assert_eq!(failed(&judge(&e, &dev)), ["snp.report_format"]);
}

#[test]
fn wrong_missing_swapped_and_expired_certificates_fail() {
    let dev = policy("development.toml");
    let mut sim = SimulatedSnp::new().unwrap();
    let evidence = collect(&sim, &dev);

    // The ASK replaced by AMD's real Milan ASK: no chain.
    let mut e = evidence.clone();
    let milan_ask =
        inferno_attestation::pki::pem_blocks(sev::certs::snp::builtin::milan::ASK, "ask")
            .unwrap()
            .remove(0);
    for c in &mut e.sev_snp.as_mut().unwrap().certs {
        if c.kind == SnpCertKind::Ask {
            c.der = Base64Bytes(milan_ask.clone());
        }
    }
    assert_eq!(failed(&judge(&e, &dev)), ["snp.chain"]);

    // VCEK and ASK roles swapped.
    let mut e = evidence.clone();
    for c in &mut e.sev_snp.as_mut().unwrap().certs {
        c.kind = match c.kind {
            SnpCertKind::Vcek => SnpCertKind::Ask,
            SnpCertKind::Ask => SnpCertKind::Vcek,
            k => k,
        };
    }
    assert_eq!(failed(&judge(&e, &dev)), ["snp.chain"]);

    // No VCEK at all.
    let mut e = evidence.clone();
    e.sev_snp
        .as_mut()
        .unwrap()
        .certs
        .retain(|c| c.kind != SnpCertKind::Vcek);
    assert_eq!(failed(&judge(&e, &dev)), ["snp.chain"]);

    // A VCEK whose validity ended in 2021.
    sim.vcek_der = simulated::VCEK_EXPIRED_DER.to_vec();
    let e = collect(&sim, &dev);
    let r = judge(&e, &dev);
    assert_eq!(failed(&r), ["snp.cert_validity"], "{r}");
    assert!(r.to_string().contains("expired"));
}

#[test]
fn policy_rules_reject_debug_vmpl_tcb_measurement_and_product() {
    let dev = policy("development.toml");
    let mut sim = SimulatedSnp::new().unwrap();
    sim.guest_policy |= 1 << 19;
    assert_eq!(failed(&judge(&collect(&sim, &dev), &dev)), ["snp.debug"]);

    let mut sim = SimulatedSnp::new().unwrap();
    sim.vmpl = 2;
    assert_eq!(failed(&judge(&collect(&sim, &dev), &dev)), ["snp.vmpl"]);

    let mut sim = SimulatedSnp::new().unwrap();
    sim.reported_tcb.snp = 9;
    assert_eq!(
        failed(&judge(&collect(&sim, &dev), &dev)),
        ["snp.tcb_binding"]
    );

    let sim = SimulatedSnp::new().unwrap();
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policy/development.toml"),
    )
    .unwrap();
    let pinned = text.replace(
        "require_crl = false",
        &format!(
            "require_crl = false\nmeasurements = [\"{}\"]",
            hex::encode([0u8; 48])
        ),
    );
    let pinned = LoadedPolicy::from_bytes(pinned.as_bytes()).unwrap();
    assert_eq!(
        failed(&judge(&collect(&sim, &pinned), &pinned)),
        ["snp.measurement"]
    );

    let genoa_only = text.replace(
        r#"products = ["Milan", "Genoa", "Turin"]"#,
        r#"products = ["Genoa"]"#,
    );
    let genoa_only = LoadedPolicy::from_bytes(genoa_only.as_bytes()).unwrap();
    assert_eq!(
        failed(&judge(&collect(&sim, &genoa_only), &genoa_only)),
        ["snp.product_allowed"]
    );

    let high_tcb = text.replace(
        "require_crl = false",
        "require_crl = false\n[sev_snp.min_tcb.Milan]\nbootloader = 3\ntee = 0\nsnp = 20\nmicrocode = 115",
    );
    let high_tcb = LoadedPolicy::from_bytes(high_tcb.as_bytes()).unwrap();
    assert_eq!(
        failed(&judge(&collect(&sim, &high_tcb), &high_tcb)),
        ["snp.min_tcb"]
    );
}

#[test]
fn runtime_data_must_match_report_data() {
    let dev = policy("development.toml");
    let sim = SimulatedSnp::new().unwrap();
    let mut e = collect(&sim, &dev);
    let mut other = runtime_data(&dev);
    other.set_challenge_bindings([[0xCD; 32]]).unwrap();
    e.runtime_data = Some(Base64Bytes(other.to_canonical_bytes()));
    assert_eq!(failed(&judge(&e, &dev)), ["runtime_data.binding"]);

    e.runtime_data = None;
    assert_eq!(failed(&judge(&e, &dev)), ["runtime_data.binding"]);

    let mut e = collect(&sim, &dev);
    let mut bytes = e.runtime_data.take().unwrap().0;
    bytes.insert(1, b' ');
    e.runtime_data = Some(Base64Bytes(bytes));
    assert_eq!(failed(&judge(&e, &dev)), ["runtime_data.binding"]);
}

#[test]
fn a_clock_set_back_before_a_seen_timestamp_is_rejected() {
    let dev = policy("development.toml");
    let sim = SimulatedSnp::new().unwrap();
    let e = collect(&sim, &dev);
    let floor = ClockFloor::starting_at(datetime!(2026-06-01 0:00 UTC), "last audit checkpoint");
    let r = appraise(&AppraisalInput {
        evidence: &e,
        policy: &dev,
        collateral: None,
        now: NOW,
        clock_floor: Some(&floor),
        gpu_ready_pending: false,
    });
    assert_eq!(failed(&r), ["time.clock_floor"], "{r}");
    // Before the test VCEK was issued: the certificate check and the floor both object.
    let r = appraise(&AppraisalInput {
        evidence: &e,
        policy: &dev,
        collateral: None,
        now: datetime!(2024-06-01 0:00 UTC),
        clock_floor: None,
        gpu_ready_pending: false,
    });
    assert_eq!(failed(&r), ["snp.cert_validity"], "{r}");
}

fn sim_file(name: &str) -> Vec<u8> {
    std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/sim")
            .join(name),
    )
    .unwrap()
}

fn judge_with_crl(
    evidence: &Evidence,
    policy: &LoadedPolicy,
    crl: Option<&str>,
) -> AppraisalReport {
    let mut bundle =
        inferno_attestation::bundle::CollateralBundle::empty("2026-01-01T00:00:00Z".into());
    if let Some(name) = crl {
        bundle.amd.crl.push(Base64Bytes(sim_file(name)));
    }
    appraise(&AppraisalInput {
        evidence,
        policy,
        collateral: Some(&bundle),
        now: NOW,
        clock_floor: None,
        gpu_ready_pending: false,
    })
}

#[test]
fn amd_crls_are_verified_for_freshness_and_revocation() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policy/development.toml"),
    )
    .unwrap();
    let strict = LoadedPolicy::from_bytes(
        text.replace("require_crl = false", "require_crl = true")
            .as_bytes(),
    )
    .unwrap();
    let sim = SimulatedSnp::new().unwrap();
    let e = collect(&sim, &strict);

    let r = judge_with_crl(&e, &strict, Some("ark.crl.der"));
    assert!(r.passed(), "{r}");
    assert!(
        r.checks
            .iter()
            .any(|c| c.id == "snp.crl" && c.passed && c.reason.contains("current"))
    );

    let r = judge_with_crl(&e, &strict, Some("ark-revokes-ask.crl.der"));
    assert_eq!(failed(&r), ["snp.crl"], "{r}");
    assert!(r.to_string().contains("revoked"), "{r}");

    // Next update 2025-06-01 is more than the development grace (30 days) before now.
    let r = judge_with_crl(&e, &strict, Some("ark-stale.crl.der"));
    assert_eq!(failed(&r), ["snp.crl"], "{r}");
    assert!(r.to_string().contains("expired"), "{r}");

    let r = judge_with_crl(&e, &strict, None);
    assert_eq!(failed(&r), ["snp.crl"], "{r}");

    // A CRL bit flip breaks its signature.
    let mut bad = sim_file("ark.crl.der");
    let n = bad.len();
    bad[n - 10] ^= 1;
    let mut bundle = inferno_attestation::bundle::CollateralBundle::empty("x".into());
    bundle.amd.crl.push(Base64Bytes(bad));
    let r = appraise(&AppraisalInput {
        evidence: &e,
        policy: &strict,
        collateral: Some(&bundle),
        now: NOW,
        clock_floor: None,
        gpu_ready_pending: false,
    });
    assert_eq!(failed(&r), ["snp.crl"], "{r}");
}

#[test]
fn vlek_signed_reports_chain_through_the_asvk() {
    let dev = policy("development.toml");
    let mut sim = SimulatedSnp::new().unwrap();
    sim.use_vlek = true;
    let evidence = collect(&sim, &dev);
    let r = judge(&evidence, &dev);
    assert!(r.passed(), "{r}");
    let snp = r.claims.sev_snp.as_ref().unwrap();
    assert_eq!(snp.signing_key, "vlek");
    assert!(r.to_string().contains("VLEK → ASVK → ARK"), "{r}");
    // No hwID check applies to a VLEK.
    assert!(!r.checks.iter().any(|c| c.id == "snp.hwid"));

    // A report that names the VLEK but comes with the VCEK chain only.
    let mut e = evidence.clone();
    e.sev_snp.as_mut().unwrap().certs = collect(&SimulatedSnp::new().unwrap(), &dev)
        .sev_snp
        .unwrap()
        .certs;
    assert_eq!(failed(&judge(&e, &dev)), ["snp.chain"]);

    // KEY_INFO rewritten to name the VCEK, with the VCEK chain supplied too: KEY_INFO is
    // signed, so the VCEK chain verifies but the report signature does not.
    let mut e = evidence;
    e.sev_snp.as_mut().unwrap().report.0[0x48] &= !(0x7 << 2);
    let vcek_certs = collect(&SimulatedSnp::new().unwrap(), &dev)
        .sev_snp
        .unwrap()
        .certs;
    e.sev_snp.as_mut().unwrap().certs.extend(vcek_certs);
    assert_eq!(failed(&judge(&e, &dev)), ["snp.report_signature"]);
}

/// The development policy naming a reference-values file, with `values` as its bytes.
fn with_reference_values(values: &str) -> LoadedPolicy {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policy/development.toml"),
    )
    .unwrap()
    .replacen(
        "platforms = ",
        "reference_values = \"reference-values.toml\"\nplatforms = ",
        1,
    );
    LoadedPolicy::with_reference_values(text.as_bytes(), values.as_bytes()).unwrap()
}

fn snp_reference_values(measurements: &[&str]) -> String {
    let list: Vec<String> = measurements
        .iter()
        .map(|m| format!("{{ product = \"Milan\", vcpus = 4, measurement = \"{m}\" }}"))
        .collect();
    format!(
        "schema = 1\nimage = \"inferno\"\n[sev_snp]\nmeasurements = [{}]\n",
        list.join(", ")
    )
}

#[test]
fn reference_values_reject_an_unlisted_launch_measurement_naming_it() {
    let sim = SimulatedSnp::new().unwrap();
    let measurement = hex::encode(simulated::default_measurement());

    let listed = with_reference_values(&snp_reference_values(&[&measurement]));
    let r = judge(&collect(&sim, &listed), &listed);
    assert!(r.passed(), "{r}");
    let applied = r
        .checks
        .iter()
        .find(|c| c.id == "policy.reference_values")
        .unwrap();
    assert!(applied.reason.contains("sev_snp.measurements"), "{r}");

    let other = with_reference_values(&snp_reference_values(&[&"00".repeat(48)]));
    let r = judge(&collect(&sim, &other), &other);
    assert_eq!(failed(&r), ["snp.measurement"], "{r}");
    let reason = &r.failures().next().unwrap().reason;
    assert!(
        reason.contains(&measurement),
        "names the measurement: {reason}"
    );
    assert!(
        reason.contains("the reference values of image \"inferno\" (reference-values.toml)"),
        "{reason}"
    );

    // No measurement computed yet: nothing is accepted.
    let none = with_reference_values(&snp_reference_values(&[]));
    let r = judge(&collect(&sim, &none), &none);
    assert_eq!(failed(&r), ["snp.measurement"], "{r}");
    assert!(r.to_string().contains(&measurement), "{r}");

    // The appliance appraising its own evidence does not apply them, and says so.
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policy/development.toml"),
    )
    .unwrap()
    .replacen(
        "platforms = ",
        "reference_values = \"rv.toml\"\nplatforms = ",
        1,
    );
    let own = LoadedPolicy::for_self_appraisal(text.as_bytes()).unwrap();
    let r = judge(&collect(&sim, &own), &own);
    assert!(r.passed(), "{r}");
    assert!(r.to_string().contains("not applied"), "{r}");
}

#[test]
fn the_production_policy_applies_the_shipped_reference_values() {
    let prod = policy("production.toml");
    let sim = SimulatedSnp::new().unwrap();
    let r = judge(&collect(&sim, &prod), &prod);
    assert!(!r.passed());
    let applied = r
        .checks
        .iter()
        .find(|c| c.id == "policy.reference_values")
        .unwrap();
    assert!(applied.passed, "{r}");
    assert!(
        applied.reason.contains("reference-values.toml")
            && applied.reason.contains("tpm.pcr_values.11"),
        "{r}"
    );
    let tpm = prod.policy.tpm.as_ref().unwrap();
    assert!(tpm.pcrs.contains(&11));
    assert_eq!(tpm.pcr_values["11"].len(), 1);
}
