//! Start-up attestation end to end: the real server (development profile, simulated TEE) serves
//! `GET /v1/attestation` over TLS; a client verifies it with the attestation crate, checks that
//! it binds the TLS key actually served and the audit log's checkpoint key, and `inferno audit
//! verify --policy --collateral` ties the log to the evidence. With a vTPM (a swtpm the test
//! starts) the evidence carries a quote whose AK the runtime data binds. The production profile
//! without a TEE refuses to serve.

mod attest_support;
mod server_support;
#[path = "../attestation/tests/swtpm_support/mod.rs"]
mod swtpm_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use attest_support::check;
use inferno::attest::binding::{BindingInput, check_start_events};
use inferno::attest::{AttestationService, StartupBinding, tls_spki_sha256};
use inferno::config::{AttestationConfig, AttestationProfile, Config};
use inferno::model::Model;
use inferno::server::Server;
use inferno_attestation::appraise::{AppraisalInput, appraise};
use inferno_attestation::bundle::{CollateralBundle, NamedBlob};
use inferno_attestation::collect::detect_hardware;
use inferno_attestation::evidence::{Base64Bytes, Evidence};
use inferno_attestation::nvidia::simulated::{
    SimulatedCert, SimulatedGpu, SimulatedGpuConfig, SimulatedOcsp, TEST_SEED,
};
use inferno_attestation::pki;
use inferno_attestation::policy::LoadedPolicy;
use inferno_attestation::report::AppraisalReport;
use inferno_audit::AuditConfig;
use inferno_audit::{VerifyOptions, verify};
use serde_json::Value;
use server_support::{Harness, base_config, runtime};
use time::{Duration, OffsetDateTime};

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
    let tls = harness.tls_connect(None).await;
    let certs = tls
        .get_ref()
        .1
        .peer_certificates()
        .expect("peer certificates");
    certs.first().expect("a leaf").as_ref().to_vec()
}

/// A start-up binding for attestation outside a server.
const BINDING: StartupBinding = StartupBinding {
    tls_spki_sha256: [1; 32],
    audit_key: None,
    model_digest: [5; 32],
    quantized_at_load: None,
};

/// Starts a server and attests it with the embedded model's digest; the error, if either fails.
fn attest_error(config: Config) -> Option<String> {
    let digest = Model::embedded().expect("embedded model").digest.bytes;
    runtime().block_on(async {
        let server = match Server::start(config).await {
            Ok(server) => server,
            Err(err) => return Some(err.to_string()),
        };
        let result = server.attest(digest).await;
        server.shutdown().await;
        result.err().map(|err| err.to_string())
    })
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
        .find(|c| c.id == "gpu.chain")
        .expect("a gpu.chain check");
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
    let key = inferno_audit::note::VerifierKey::parse(&report.starts[0].checkpoint_key)
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
        no_freshness: false,
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

    // Issue 47: `--no-freshness` (an old log's start-up evidence) says NOT FRESH, and passes
    // only under a policy that allows unfresh evidence for offline audit.
    let unfresh = |policy: &Path| {
        Command::new(env!("CARGO_BIN_EXE_inferno"))
            .args(["audit", "verify", "--no-freshness"])
            .arg(&log_dir)
            .arg("--policy")
            .arg(policy)
            .arg("--collateral")
            .arg(&bundle)
            .output()
            .expect("run inferno audit verify --no-freshness")
    };
    let refused = unfresh(&policy_path("development.toml"));
    let stdout = String::from_utf8_lossy(&refused.stdout);
    assert_eq!(refused.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("freshness: NOT FRESH") && stdout.contains("allow_unfresh_evidence"),
        "{stdout}"
    );
    let allowing = work.path().join("audit-offline.toml");
    let text = std::fs::read_to_string(policy_path("development.toml")).unwrap();
    std::fs::write(
        &allowing,
        text.replacen("[time]\n", "[time]\nallow_unfresh_evidence = true\n", 1),
    )
    .unwrap();
    let accepted = unfresh(&allowing);
    let stdout = String::from_utf8_lossy(&accepted.stdout);
    assert!(accepted.status.success(), "{stdout}");
    assert!(
        stdout.contains("ATTESTED, NOT FRESH: 1 checkpoint keys"),
        "{stdout}"
    );
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
    let err = attest_error(config).expect("the production profile refuses without a TEE");
    assert!(err.contains("no TEE found"), "{err}");

    let mut config = base_config();
    config.attestation = AttestationConfig {
        policy: Some(policy_path("production.toml")),
        ..AttestationConfig::development()
    };
    let err = attest_error(config).expect("simulated evidence fails the production policy");
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
            "[server]\nlisten = \"127.0.0.1:0\"\n[attestation]\nprofile = \"production\"\n[audit]\ndir = {:?}\n[[auth.keys]]\nname = \"ops\"\nsha256 = \"{}\"\n",
            work.path().join("audit"),
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
        policy: Some(policy_requiring_cc_mode(dir.path())),
        cuda: true,
        ..AttestationConfig::development()
    };
    let err = attest_error(config)
        .expect("refused a GPU whose CC mode is unknown under a policy requiring it");
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
    let service = AttestationService::start(
        &AttestationConfig {
            policy: Some(policy_requiring_cc_mode(dir.path())),
            ..AttestationConfig::development()
        },
        BINDING,
        None,
    )
    .expect("the simulated GPU reports CC mode on");
    let attested = service.startup();
    let cc = attested
        .appraisal
        .checks
        .iter()
        .find(|c| c.id == "gpu.cc_mode")
        .expect("a gpu.cc_mode check");
    assert!(cc.passed, "{}", cc.reason);
    assert!(attested.banner_line().contains("SIMULATED"));
}

#[test]
fn start_up_appraisal_uses_the_configured_collateral_bundle() {
    if detect_hardware().is_some() {
        eprintln!("SKIPPED: this machine has TEE hardware; the test expects the simulated TEE");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(policy_requiring_cc_mode(dir.path()))
        .unwrap()
        .replace("require_ocsp = false", "require_ocsp = true");
    assert!(text.contains("require_ocsp = true"));
    let policy = dir.path().join("ocsp.toml");
    std::fs::write(&policy, text).unwrap();
    let establish = |collateral: Option<PathBuf>| {
        AttestationService::start(
            &AttestationConfig {
                policy: Some(policy.clone()),
                collateral,
                ..AttestationConfig::development()
            },
            BINDING,
            None,
        )
    };

    let err = establish(None)
        .err()
        .expect("OCSP required, no bundle")
        .to_string();
    assert!(err.contains("gpu.ocsp"), "{err}");

    let now = OffsetDateTime::now_utc();
    let gpu = SimulatedGpu::new(TEST_SEED, SimulatedGpuConfig::default()).unwrap();
    let response = gpu
        .ocsp_response(&SimulatedOcsp {
            subject: SimulatedCert::Ica,
            revoked: None,
            this_update: now - Duration::days(1),
            next_update: now + Duration::days(6),
            signer: SimulatedCert::Root,
        })
        .unwrap();
    let mut bundle = CollateralBundle::empty(pki::rfc3339(now));
    bundle.nvidia.ocsp.push(NamedBlob {
        name: "ica.ocsp.der".to_owned(),
        data: Base64Bytes(response),
    });
    let bundle_path = dir.path().join("bundle.json");
    std::fs::write(&bundle_path, bundle.to_json()).unwrap();
    let service = establish(Some(bundle_path.clone())).expect("a fresh response in the bundle");
    let ocsp = service
        .startup()
        .appraisal
        .checks
        .iter()
        .find(|c| c.id == "gpu.ocsp")
        .expect("a gpu.ocsp check");
    assert!(ocsp.passed, "{}", ocsp.reason);

    std::fs::write(&bundle_path, "{").unwrap();
    let err = establish(Some(bundle_path))
        .err()
        .expect("a corrupt bundle")
        .to_string();
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.contains("[attestation] collateral"), "{err}");
}

/// `inferno attest verify EVIDENCE --policy development.toml --json`: exit code and report.
fn attest_verify(evidence: &Path) -> (Option<i32>, Value) {
    attest_support::attest_verify(evidence, &policy_path("development.toml"), &[])
}

#[tokio::test]
async fn with_a_vtpm_the_served_evidence_carries_a_quote_bound_to_the_runtime_data() {
    if detect_hardware().is_some() {
        eprintln!("SKIPPED: this machine has TEE hardware; the test expects the simulated TEE");
        return;
    }
    let Some(swtpm) = swtpm_support::start_swtpm() else {
        return;
    };
    let mut config = base_config();
    config.attestation.tpm_tcti = Some(swtpm_support::tcti(&swtpm));
    let mut harness = Harness::start(config, false);
    let document: Value = harness
        .client()
        .get(harness.url("/v1/attestation"))
        .send()
        .await
        .expect("GET /v1/attestation")
        .json()
        .await
        .expect("JSON");
    let server = harness.take_server();
    std::thread::spawn(move || runtime().block_on(server.shutdown()))
        .join()
        .expect("shutdown");

    let evidence = Evidence::from_bytes(&serde_json::to_vec(&document["evidence"]).unwrap())
        .expect("the envelope decodes");
    let tpm = evidence.tpm.as_ref().expect("a vTPM section");
    assert_eq!(tpm.quotes.len(), 1, "one SHA-256 quote");
    let quoted: Vec<u8> = tpm.quotes[0].pcrs.values.iter().map(|v| v.index).collect();
    assert_eq!(quoted, (0..=7).collect::<Vec<u8>>(), "the policy's PCRs");
    let bound_ak = document["runtime_data"]["tpm_ak_sha256"]
        .as_str()
        .expect("the runtime data names the AK");
    let ak = tpm.ak.key().expect("AK").spki_sha256().expect("AK hash");
    assert_eq!(bound_ak, hex::encode(ak));

    let work = tempfile::tempdir().expect("tempdir");
    let path = work.path().join("evidence.json");
    std::fs::write(&path, evidence.to_json()).unwrap();
    let (code, report) = attest_verify(&path);
    assert_eq!(code, Some(0), "{report:#}");
    for id in [
        "tpm.quote",
        "tpm.nonce",
        "tpm.pcr_selection",
        "tpm.ak_binding",
    ] {
        let (passed, reason) = check(&report, id);
        assert!(passed, "{id}: {reason}");
    }
    let (_, quote) = check(&report, "tpm.quote");
    assert!(
        quote.contains("AK signature") && quote.contains("PCR digests"),
        "{quote}"
    );
    assert_eq!(report["claims"]["tpm"]["ak_spki_sha256"], bound_ak);

    // A PCR value changed after the quote no longer matches the signed PCR digest.
    let mut forged = evidence.clone();
    if let Some(tpm) = forged.tpm.as_mut() {
        tpm.quotes[0].pcrs.values[0].value[0] ^= 1;
    }
    std::fs::write(&path, forged.to_json()).unwrap();
    let (code, report) = attest_verify(&path);
    assert_eq!(code, Some(1), "{report:#}");
    let (passed, reason) = check(&report, "tpm.quote");
    assert!(!passed && reason.contains("PCR"), "{reason}");

    // A quote from another TPM (another AK) is not the one the runtime data binds.
    let Some(other) = swtpm_support::start_swtpm() else {
        return;
    };
    let doc = inferno_attestation::runtime_data::RuntimeData::from_canonical_bytes(
        &evidence.runtime_data.as_ref().expect("runtime data").0,
    )
    .expect("document");
    let mut session = inferno_attestation::tpm::collect::TpmSession::open(
        &swtpm_support::tcti(&other),
        None,
        inferno_attestation::tpm::collect::AkKind::EccP256,
    )
    .expect("open the other swtpm");
    let mut swapped = evidence.clone();
    swapped.tpm = Some(
        session
            .evidence(
                &[inferno_attestation::tpm::HashAlg::Sha256],
                &(0..=7).collect::<Vec<u8>>(),
                &doc.tpm_qualifying_data(),
                None,
            )
            .expect("quote"),
    );
    std::fs::write(&path, swapped.to_json()).unwrap();
    let (code, report) = attest_verify(&path);
    assert_eq!(code, Some(1), "{report:#}");
    let (passed, reason) = check(&report, "tpm.ak_binding");
    assert!(!passed && reason.contains("names AK"), "{reason}");
}
