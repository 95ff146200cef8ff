//! Start-up attestation end to end: the real server (development profile, simulated TEE) serves
//! `GET /v1/attestation` over TLS; a client verifies it with the attestation crate, checks that
//! it binds the TLS key actually served and the audit log's checkpoint key, and `inferno audit
//! verify --policy --collateral` ties the log to the evidence. The production profile without
//! a TEE refuses to serve.

mod server_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use inferno::attest::binding::{BindingInput, check_start_events};
use inferno::attest::tls_spki_sha256;
use inferno::audit::AuditConfig;
use inferno::audit::verify::{VerifyOptions, verify};
use inferno::config::{AttestationConfig, AttestationProfile, Config};
use inferno::server::Server;
use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::collect::detect_hardware;
use inferno_attestation::evidence::Evidence;
use inferno_attestation::pki;
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::report::AppraisalReport;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use server_support::{Harness, base_config, runtime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn policy_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("policy")
        .join(name)
}

fn policy(name: &str) -> LoadedPolicy {
    LoadedPolicy::from_file(&policy_path(name)).expect("policy loads")
}

fn judge(evidence: &Evidence, policy: &LoadedPolicy) -> AppraisalReport {
    appraise(&AppraisalInput {
        evidence,
        policy,
        collateral: None,
        now: time::OffsetDateTime::now_utc(),
        clock_floor: None,
        gpu_ready_pending: true,
    })
}

/// The leaf certificate the server presents in a real TLS handshake.
async fn served_leaf(harness: &Harness) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(harness.cert_pem.as_bytes()) {
        roots.add(cert.expect("certificate PEM")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(harness.addr).await.expect("connect");
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let certs = tls
        .get_ref()
        .1
        .peer_certificates()
        .expect("peer certificates");
    certs.first().expect("a leaf").as_ref().to_vec()
}

fn audit_config(dir: &Path) -> AuditConfig {
    AuditConfig {
        dir: dir.to_path_buf(),
        checkpoint_every_records: 2,
        ..AuditConfig::default()
    }
}

#[tokio::test]
async fn attestation_document_verifies_and_binds_the_served_tls_key_and_audit_key() {
    if detect_hardware().is_some() {
        eprintln!("SKIPPED: this machine has TEE hardware; the test expects the simulated TEE");
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let log_dir = work.path().join("audit");
    let mut config = base_config();
    config.audit = Some(audit_config(&log_dir));
    let mut harness = Harness::start(config, false);

    // Unauthenticated, like /health: a client verifies before it sends anything.
    let response = harness
        .client()
        .get(harness.url("/v1/attestation"))
        .send()
        .await
        .expect("GET /v1/attestation");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let document: Value = response.json().await.expect("JSON");
    let evidence = Evidence::from_bytes(&serde_json::to_vec(&document["evidence"]).unwrap())
        .expect("the envelope decodes");

    let dev = judge(&evidence, &policy("development.toml"));
    assert!(dev.passed(), "{:#?}", dev.failures().collect::<Vec<_>>());
    assert!(dev.simulated);
    let doc = dev.claims.runtime_data.as_ref().expect("a bound document");
    assert_eq!(
        serde_json::to_value(doc).unwrap(),
        document["runtime_data"],
        "the served runtime-data document is the one bound into REPORT_DATA"
    );
    assert_eq!(document["appraisal"]["verdict"], "pass");
    assert_eq!(document["appraisal"]["simulated"], true);

    // The development profile attaches the simulated GPU's evidence over the runtime data's
    // GPU nonce, and the GPU appraisal path verifies it against the policy-named test root.
    let gpu = evidence.gpu.as_ref().expect("a gpu section");
    assert!(!gpu.cert_chain.is_empty());
    let gpu_claims = dev.claims.gpu.as_ref().expect("verified GPU claims");
    assert!(gpu_claims.simulated, "the GPU evidence is marked simulated");
    let gpu_verify = dev
        .checks
        .iter()
        .find(|c| c.id == "gpu.verify")
        .expect("a gpu.verify check");
    assert!(gpu_verify.passed, "{}", gpu_verify.reason);
    assert!(
        gpu_verify.reason.contains("simulated"),
        "{}",
        gpu_verify.reason
    );

    let served = served_leaf(&harness).await;
    assert_eq!(
        doc.tls_spki_sha256.as_deref(),
        Some(hex::encode(tls_spki_sha256(&served).unwrap()).as_str()),
        "the evidence binds the key of the certificate actually served"
    );
    let dev_bytes = std::fs::read(policy_path("development.toml")).unwrap();
    assert_eq!(doc.policy_sha256, hex::encode(pki::sha256(&dev_bytes)));
    assert_eq!(
        doc.software_version,
        format!("inferno/{}", env!("CARGO_PKG_VERSION"))
    );

    let prod = judge(&evidence, &policy("production.toml"));
    assert!(!prod.passed(), "the production policy must reject it");
    let reasons: Vec<String> = prod.failures().map(|c| c.reason.clone()).collect();
    assert!(
        reasons.iter().any(|r| r.contains("simulated")),
        "the rejection says simulated: {reasons:?}"
    );

    // The audit log: its start event carries this evidence and its checkpoint key is the
    // audit key in the runtime-data document.
    let server = harness.take_server();
    std::thread::spawn(move || runtime().block_on(server.shutdown()))
        .join()
        .expect("shutdown");
    let report = verify(&log_dir, &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    assert_eq!(report.starts.len(), 1);
    let key = inferno::audit::note::VerifierKey::parse(&report.starts[0].checkpoint_key)
        .expect("checkpoint key");
    assert_eq!(
        doc.audit_key.as_deref(),
        Some(hex::encode(key.public).as_str())
    );
    let dev_policy = policy("development.toml");
    let input = BindingInput {
        policy: &dev_policy,
        collateral: None,
        now: time::OffsetDateTime::now_utc(),
    };
    assert_eq!(check_start_events(&report.starts, &input), Ok(1));
    let prod_policy = policy("production.toml");
    let err = check_start_events(
        &report.starts,
        &BindingInput {
            policy: &prod_policy,
            ..input
        },
    )
    .unwrap_err();
    assert!(err.contains("rejected"), "{err}");

    // The compliance CLI gives the same verdicts.
    let bundle = work.path().join("bundle.json");
    std::fs::write(
        &bundle,
        CollateralBundle::empty("2026-01-01T00:00:00Z".into()).to_json(),
    )
    .unwrap();
    let cli = |policy: &str| {
        Command::new(env!("CARGO_BIN_EXE_inferno"))
            .args(["audit", "verify"])
            .arg(&log_dir)
            .arg("--policy")
            .arg(policy_path(policy))
            .arg("--collateral")
            .arg(&bundle)
            .output()
            .expect("run inferno audit verify")
    };
    let ok = cli("development.toml");
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{stdout}");
    assert!(stdout.contains("ATTESTED: 1 checkpoint keys"), "{stdout}");
    let bad = cli("production.toml");
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("VIOLATION: record 0"), "{stdout}");
}

#[test]
fn production_profile_without_a_tee_refuses_to_start() {
    if detect_hardware().is_some() {
        eprintln!("SKIPPED: this machine has TEE hardware");
        return;
    }
    // The production policy requires API keys: configure some, to reach attestation.
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.auth.keys = base_config().auth.keys;
    assert_eq!(config.attestation.profile, AttestationProfile::Production);
    let err = match runtime().block_on(Server::start(config)) {
        Ok(_) => panic!("the production profile served without a TEE"),
        Err(err) => err.to_string(),
    };
    assert!(err.contains("no TEE found"), "{err}");

    let mut config = base_config();
    config.attestation = AttestationConfig {
        profile: AttestationProfile::Development,
        policy: Some(policy_path("production.toml")),
        cuda: false,
    };
    let err = match runtime().block_on(Server::start(config)) {
        Ok(_) => panic!("simulated evidence passed the production policy"),
        Err(err) => err.to_string(),
    };
    assert!(err.contains("rejected by policy \"production\""), "{err}");
}

#[test]
fn serve_with_the_production_profile_exits_with_a_one_line_cause() {
    if detect_hardware().is_some() {
        eprintln!("SKIPPED: this machine has TEE hardware");
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let config = work.path().join("inferno.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[attestation]\nprofile = \"production\"\n[[auth.keys]]\nname = \"ops\"\nsha256 = \"{}\"\n",
            "ab".repeat(32)
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["serve", "--device", "cpu", "--config"])
        .arg(&config)
        .env("RUST_LOG", "off")
        .output()
        .expect("run inferno serve");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("no TEE found"), "{stderr}");
}

/// The development policy with `[gpu] require_cc_mode = true`, written to `dir`.
fn policy_requiring_cc_mode(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(policy_path("development.toml"))
        .unwrap()
        .replace("require_cc_mode = false", "require_cc_mode = true");
    assert!(text.contains("require_cc_mode = true"));
    let path = dir.join("cc.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn cuda_on_a_gpu_whose_cc_state_is_unreadable_refuses_to_start_when_the_policy_requires_cc_mode() {
    if inferno_attestation::nvidia::nvml::Nvml::load().is_ok() {
        eprintln!("SKIPPED: NVML loads on this machine; the test expects no readable GPU");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = base_config();
    config.attestation = AttestationConfig {
        profile: AttestationProfile::Development,
        policy: Some(policy_requiring_cc_mode(dir.path())),
        cuda: true,
    };
    let err = match runtime().block_on(Server::start(config)) {
        Ok(_) => panic!("served on a GPU whose CC mode is unknown under a policy requiring it"),
        Err(err) => err.to_string(),
    };
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.contains("GPU 0"), "names the GPU: {err}");
    assert!(
        err.contains("policy \"development (accepts simulated TEE)\" requires CC mode"),
        "names the policy: {err}"
    );
}

#[test]
fn the_cpu_backend_under_a_policy_requiring_cc_mode_attests_the_simulated_gpu_in_cc_mode() {
    if detect_hardware().is_some() {
        eprintln!("SKIPPED: this machine has TEE hardware; the test expects the simulated TEE");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let attested = inferno::attest::StartupAttestation::establish(
        &AttestationConfig {
            profile: AttestationProfile::Development,
            policy: Some(policy_requiring_cc_mode(dir.path())),
            cuda: false,
        },
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .unwrap()
            .cert
            .pem()
            .as_bytes(),
        None,
    )
    .expect("the simulated GPU reports CC mode on");
    let cc = attested
        .appraisal
        .checks
        .iter()
        .find(|c| c.id == "gpu.cc_mode")
        .expect("a gpu.cc_mode check");
    assert!(cc.passed, "{}", cc.reason);
    assert!(attested.banner_line().contains("SIMULATED"));
}
