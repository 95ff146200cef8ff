//! The client's checks on one connection, each failure by name, on evidence the simulated TEE
//! signs here: certificates carrying it in the evidence extension, fresh evidence bound to a
//! nonce and an exporter. These run on any machine; `tests/client_trust.rs` runs the same
//! attacks against the real server over real TLS.

use inferno_attestation::collect::collect_evidence;
use inferno_attestation::collect::simulated::SimulatedSnp;
use inferno_attestation::evidence::{Base64Bytes, Evidence};
use inferno_attestation::runtime_data::{
    EVIDENCE_EXTENSION_OID_DER, RuntimeData, challenge_binding,
};
use inferno_client::policy::LoadedClientPolicy;
use inferno_client::{Observation, TrustReport, appraise_connection, read_certificate};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

const CHECKS: [&str; 10] = [
    "tls.certificate_evidence",
    "evidence.appraisal",
    "tls.spki",
    "fresh.challenge",
    "fresh.same_instance",
    "policy.server_policy_digest",
    "policy.model_digest",
    "policy.measurement",
    "policy.min_tcb",
    "policy.gpu",
];

const MODEL: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const SERVER_POLICY: [u8; 32] = [0x22; 32];

fn development_policy_text() -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/client-development.toml"),
    )
    .expect("client development policy")
}

/// The development client policy with `extra` top-level keys, or with the table `extra` when it
/// starts with `[`.
fn policy_with(extra: &str) -> LoadedClientPolicy {
    let text = if extra.starts_with('[') {
        format!("{}\n{extra}\n", development_policy_text())
    } else {
        development_policy_text().replacen(
            "accept_simulated = true\n",
            &format!("accept_simulated = true\n{extra}\n"),
            1,
        )
    };
    LoadedClientPolicy::from_bytes(text.as_bytes()).expect("client policy")
}

fn development() -> LoadedClientPolicy {
    policy_with("")
}

/// A simulated server instance: its TLS key, its start-up document and evidence, and the
/// certificate carrying that evidence.
struct Instance {
    tee: SimulatedSnp,
    startup: RuntimeData,
    certificate: Vec<u8>,
}

impl Instance {
    fn new(model: &str) -> Self {
        Self::with_tee(SimulatedSnp::new().expect("simulated TEE"), model)
    }

    fn with_tee(tee: SimulatedSnp, model: &str) -> Self {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut startup = RuntimeData::new(SERVER_POLICY, "inferno/test");
        startup.tls_spki_sha256 = Some(hex::encode(Sha256::digest(
            rcgen::PublicKeyData::subject_public_key_info(&key),
        )));
        startup.model_digest = Some(model.to_owned());
        startup.audit_key = Some("33".repeat(32));
        let evidence = collect_evidence(&tee, &startup).expect("start-up evidence");
        let certificate = certificate_with_extension(
            &key,
            Some(&serde_json::to_vec(&evidence).expect("evidence JSON")),
        );
        Self {
            tee,
            startup,
            certificate,
        }
    }

    /// Fresh evidence answering these challenges (nonce, exporter).
    fn fresh(&self, challenges: &[(&[u8], &[u8])]) -> Evidence {
        let mut document = self.startup.clone();
        document
            .set_challenge_bindings(challenges.iter().map(|(n, e)| challenge_binding(n, e)))
            .expect("bindings");
        collect_evidence(&self.tee, &document).expect("fresh evidence")
    }

    /// What a client observes on a genuine connection to this instance.
    fn observe(&self, nonce: &[u8], exporter: &[u8]) -> Observation {
        Observation {
            certificate: self.certificate.clone(),
            exporter: exporter.to_vec(),
            nonce: nonce.to_vec(),
            fresh_evidence: self.fresh(&[(nonce, exporter)]),
        }
    }
}

/// A self-signed certificate for `key`, with `content` as the evidence extension's value when
/// given. rcgen takes OID arcs as u64 and the evidence OID's last arc is larger: the extension is
/// written under a placeholder OID of the same DER length (2.25 and eighteen arcs 1) whose bytes
/// are then replaced. The self-signature no longer verifies, which the client never checks: its
/// trust comes from the evidence, and the TLS handshake proves possession of the key.
fn certificate_with_extension(key: &rcgen::KeyPair, content: Option<&[u8]>) -> Vec<u8> {
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("certificate params");
    let placeholder_arcs: Vec<u64> = [2, 25].into_iter().chain([1; 18]).collect();
    if let Some(content) = content {
        params
            .custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                &placeholder_arcs,
                content.to_vec(),
            ));
    }
    let mut der = params.self_signed(key).expect("certificate").der().to_vec();
    if content.is_some() {
        let mut placeholder = vec![0x06, 0x13, 0x69];
        placeholder.extend([1u8; 18]);
        let mut real = vec![0x06, 0x13];
        real.extend_from_slice(EVIDENCE_EXTENSION_OID_DER);
        let at = der
            .windows(placeholder.len())
            .position(|w| w == placeholder.as_slice())
            .expect("placeholder OID");
        der[at..at + real.len()].copy_from_slice(&real);
    }
    der
}

fn judge(observed: &Observation, policy: &LoadedClientPolicy) -> TrustReport {
    appraise_connection(observed, policy, None, OffsetDateTime::now_utc())
}

fn failed(report: &TrustReport) -> Vec<&str> {
    report.failures().map(|c| c.id.as_str()).collect()
}

const NONCE: &[u8] = &[7u8; 32];
const EXPORTER: &[u8] = &[9u8; 32];

#[test]
fn a_genuine_connection_passes_every_check_by_name() {
    let server = Instance::new(MODEL);
    let report = judge(&server.observe(NONCE, EXPORTER), &development());
    assert!(report.trusted(), "{report}");
    assert!(report.simulated);
    let ids: Vec<&str> = report.checks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, CHECKS);
    assert_eq!(report.model_digest.as_deref(), Some(MODEL));
    assert_eq!(
        report.server_policy_sha256.as_deref(),
        Some(hex::encode(SERVER_POLICY).as_str())
    );
    assert_eq!(
        report.measurement.as_deref(),
        Some(hex::encode(server.tee.measurement).as_str())
    );
    let text = report.to_string();
    assert!(
        text.starts_with("verdict: TRUSTED (SIMULATED TEE"),
        "{text}"
    );

    // Fresh evidence answering several coalesced challenges, this connection's among them.
    let other: &[u8] = &[1u8; 16];
    let coalesced = Observation {
        fresh_evidence: server.fresh(&[(other, other), (NONCE, EXPORTER), (other, EXPORTER)]),
        ..server.observe(NONCE, EXPORTER)
    };
    assert!(judge(&coalesced, &development()).trusted());
}

#[test]
fn the_certificate_is_read_from_the_evidence_extension() {
    let server = Instance::new(MODEL);
    let claims = read_certificate(&server.certificate).expect("certificate");
    assert_eq!(
        Some(claims.spki_sha256.as_str()),
        server.startup.tls_spki_sha256.as_deref()
    );
    claims.evidence.expect("evidence in the extension");

    let key = rcgen::KeyPair::generate().expect("key");
    let plain = read_certificate(&certificate_with_extension(&key, None)).expect("certificate");
    let reason = plain.evidence.expect_err("no extension");
    assert!(reason.contains("no evidence extension"), "{reason}");
    let garbage = read_certificate(&certificate_with_extension(&key, Some(b"not json")))
        .expect("certificate");
    assert!(garbage.evidence.is_err());
    assert!(read_certificate(b"not DER").is_err());
}

#[test]
fn a_relay_with_its_own_key_and_the_servers_evidence_fails_tls_spki() {
    let server = Instance::new(MODEL);
    let evidence = read_certificate(&server.certificate)
        .expect("certificate")
        .evidence
        .expect("evidence");
    let relay_key = rcgen::KeyPair::generate().expect("key");
    let relay_certificate = certificate_with_extension(
        &relay_key,
        Some(&serde_json::to_vec(&evidence).expect("JSON")),
    );
    // Even fresh evidence that binds this (the relay's) connection does not help.
    let observed = Observation {
        certificate: relay_certificate,
        ..server.observe(NONCE, EXPORTER)
    };
    let report = judge(&observed, &development());
    assert_eq!(failed(&report), ["tls.spki"], "{report}");
    assert!(
        report
            .failure_summary()
            .contains("this connection's certificate has")
    );
}

#[test]
fn fresh_evidence_for_another_connection_or_nonce_fails_fresh_challenge() {
    let server = Instance::new(MODEL);
    let other_exporter = Observation {
        fresh_evidence: server.fresh(&[(NONCE, &[8u8; 32])]),
        ..server.observe(NONCE, EXPORTER)
    };
    let report = judge(&other_exporter, &development());
    assert_eq!(failed(&report), ["fresh.challenge"], "{report}");
    assert!(
        report
            .failure_summary()
            .contains("another connection or another nonce")
    );

    let other_nonce = Observation {
        fresh_evidence: server.fresh(&[(&[6u8; 32], EXPORTER)]),
        ..server.observe(NONCE, EXPORTER)
    };
    assert_eq!(
        failed(&judge(&other_nonce, &development())),
        ["fresh.challenge"]
    );

    // The start-up evidence answers no challenge.
    let startup_as_fresh = Observation {
        fresh_evidence: collect_evidence(&server.tee, &server.startup).expect("evidence"),
        ..server.observe(NONCE, EXPORTER)
    };
    assert_eq!(
        failed(&judge(&startup_as_fresh, &development())),
        ["fresh.challenge"]
    );
}

#[test]
fn fresh_evidence_from_another_instance_fails_fresh_same_instance() {
    let server = Instance::new(MODEL);
    let other_model = Instance::new(&"44".repeat(32));
    let observed = Observation {
        fresh_evidence: other_model.fresh(&[(NONCE, EXPORTER)]),
        ..server.observe(NONCE, EXPORTER)
    };
    let report = judge(&observed, &development());
    assert_eq!(failed(&report), ["fresh.same_instance"], "{report}");
    let summary = report.failure_summary();
    assert!(summary.contains("tls_spki_sha256"), "{summary}");
    assert!(summary.contains("model_digest"), "{summary}");

    // Another launch (another measurement) answering this very challenge.
    let mut tee = SimulatedSnp::new().expect("simulated TEE");
    tee.measurement = [0x5a; 48];
    let relaunched = Instance::with_tee(tee, MODEL);
    let mut document = server.startup.clone();
    document
        .set_challenge_bindings([challenge_binding(NONCE, EXPORTER)])
        .expect("bindings");
    let observed = Observation {
        fresh_evidence: collect_evidence(&relaunched.tee, &document).expect("evidence"),
        ..server.observe(NONCE, EXPORTER)
    };
    let report = judge(&observed, &development());
    assert_eq!(failed(&report), ["policy.measurement"], "{report}");
}

#[test]
fn the_client_policys_allow_lists_and_minimum_tcb_name_their_check() {
    let server = Instance::new(MODEL);
    let observed = server.observe(NONCE, EXPORTER);
    let measurement = hex::encode(server.tee.measurement);
    let cases = [
        (
            format!("measurements = [\"{}\"]", "ab".repeat(48)),
            "policy.measurement",
        ),
        (
            format!("server_policy_sha256 = [\"{}\"]", "cd".repeat(32)),
            "policy.server_policy_digest",
        ),
        (
            format!("model_digests = [\"{}\"]", "ef".repeat(32)),
            "policy.model_digest",
        ),
        (
            "[min_tcb.Milan]\nbootloader = 3\ntee = 0\nsnp = 9\nmicrocode = 115".to_owned(),
            "policy.min_tcb",
        ),
    ];
    for (extra, check) in cases {
        let report = judge(&observed, &policy_with(&extra));
        assert_eq!(failed(&report), [check], "{extra}: {report}");
        assert!(report.to_string().contains(&format!("[FAIL] {check}: ")));
    }
    let pinned = policy_with(&format!(
        "measurements = [\"{measurement}\"]\nserver_policy_sha256 = [\"{}\"]\nmodel_digests = [\"{MODEL}\"]",
        hex::encode(SERVER_POLICY)
    ));
    let report = judge(&observed, &pinned);
    assert!(report.trusted(), "{report}");
    let minimum = policy_with("[min_tcb.Milan]\nbootloader = 3\ntee = 0\nsnp = 8\nmicrocode = 115");
    let report = judge(&observed, &minimum);
    assert!(report.trusted(), "{report}");
    assert!(
        report
            .to_string()
            .contains("meets the client policy's minimum")
    );
}

#[test]
fn simulated_or_tampered_evidence_fails_evidence_appraisal() {
    let server = Instance::new(MODEL);
    let observed = server.observe(NONCE, EXPORTER);

    // The production template accepts no simulated TEE.
    let production = LoadedClientPolicy::from_file(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/client-production.toml"),
    )
    .expect("production client policy");
    let report = judge(&observed, &production);
    assert!(!report.trusted());
    assert!(failed(&report).contains(&"evidence.appraisal"), "{report}");

    // Fresh evidence whose runtime data was changed after the report was signed.
    let mut tampered = observed.clone();
    let mut document = server.startup.clone();
    document
        .set_challenge_bindings([challenge_binding(NONCE, EXPORTER)])
        .expect("bindings");
    document.model_digest = Some("55".repeat(32));
    tampered.fresh_evidence.runtime_data = Some(Base64Bytes(document.to_canonical_bytes()));
    let report = judge(&tampered, &development());
    let failures = failed(&report);
    assert!(failures.contains(&"evidence.appraisal"), "{report}");
    assert!(!report.trusted());
}

#[test]
fn a_launch_measurement_not_in_the_reference_values_fails_naming_it() {
    let server = Instance::new(MODEL);
    let observed = server.observe(NONCE, EXPORTER);
    let measurement = hex::encode(inferno_attestation::collect::simulated::default_measurement());
    let with_values = |listed: &str| {
        let text = development_policy_text().replacen(
            "schema = 1",
            "schema = 1\nreference_values = \"reference-values.toml\"",
            1,
        );
        let values = format!(
            "schema = 1\nimage = \"inferno\"\n[sev_snp]\nmeasurements = [{{ product = \"Milan\", vcpus = 4, measurement = \"{listed}\" }}]\n"
        );
        LoadedClientPolicy::with_reference_values(text.as_bytes(), values.as_bytes())
            .expect("client policy with reference values")
    };
    let report = judge(&observed, &with_values(&measurement));
    assert!(report.trusted(), "{report}");

    let report = judge(&observed, &with_values(&"00".repeat(48)));
    assert!(!report.trusted());
    assert_eq!(failed(&report), ["evidence.appraisal"], "{report}");
    let text = report.to_string();
    assert!(text.contains(&measurement), "names the measurement: {text}");
    assert!(text.contains("reference values of image"), "{text}");
}
