//! The key broker (issue 10) end to end with the simulated TEE: a model sealed to the broker is
//! released to evidence that passes the release policy and reproduces the golden outputs;
//! `inferno serve --key-broker` serves it; a wrong measurement, a model the broker does not
//! release, a broker that is down, and a replayed or stale challenge are refused; every
//! release and refusal is in the broker's audit log, which `inferno audit verify` accepts.

#![cfg(feature = "simulated-tee")]

mod sealed_serve_support;
mod support;

use sealed_serve_support::{
    dev_config, inferno, key_releases, refused_serve, serve_args, spawn_until_listening, terminate,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inferno::config::AttestationConfig;
use inferno::engine::EngineConfig;
use inferno::keybroker::protocol::{
    ATTEST_PATH, AUTH_PATH, AttestRequest, AuthRequest, AuthResponse, PROTOCOL_VERSION,
};
use inferno::keybroker::server::{Broker, load_or_create_keys};
use inferno::keybroker::{BrokerError, KeyRequest, ReleasePolicy, request_key};
use inferno::model::{Model, ModelDigest};
use inferno::seal::manifest::{MIN_CHUNK_SIZE, Manifest, ReleaseRequirements};
use inferno::seal::recipient::{RecipientKey, RecipientSecret};
use inferno::seal::{ModelKey, SealOptions, open_sealed, seal_dir};
use inferno_attestation::evidence::Evidence;
use inferno_attestation::runtime_data::RuntimeData;
use inferno_audit::{AuditConfig, AuditSink, ContentMode};
use support::{committed_fixture, engine, golden, greedy, run};

const MODEL_ID: &str = "inferno-tiny";

/// SHA-256 of the embedded development policy (the appliance's server policy), hex.
fn dev_policy_digest() -> String {
    hex::encode(ring::digest::digest(
        &ring::digest::SHA256,
        inferno::attest::DEVELOPMENT_POLICY,
    ))
}

/// The simulated guest's launch measurement, hex.
fn simulated_measurement() -> String {
    hex::encode(inferno_attestation::collect::simulated::default_measurement())
}

/// A release policy appraising under the development policy with one rule for `model_id`.
fn release_policy(dir: &Path, model_id: &str, key_id: &str, measurement: &str) -> PathBuf {
    let path = dir.join("release.toml");
    std::fs::write(
        &path,
        format!(
            "appraisal = \"development\"\n[[model]]\nid = \"{model_id}\"\nkey_ids = [\"{key_id}\"]\nmeasurements = [\"{measurement}\"]\nserver_policies = [\"{}\"]\n",
            dev_policy_digest()
        ),
    )
    .unwrap();
    path
}

/// Seals the committed fixture to `recipient` under model id [`MODEL_ID`].
fn seal_to(work: &Path, recipient: &RecipientKey) -> (PathBuf, Manifest) {
    let out = work.join("sealed");
    let options = SealOptions {
        chunk_size: MIN_CHUNK_SIZE,
        release: ReleaseRequirements {
            model_id: Some(MODEL_ID.into()),
            policy_sha256: Vec::new(),
        },
        recipient: Some(recipient.clone()),
        progress: false,
    };
    let manifest = seal_dir(
        &committed_fixture("inferno-tiny"),
        &out,
        &ModelKey::generate().unwrap(),
        &options,
    )
    .unwrap();
    (out, manifest)
}

/// A broker in `work` with its own recipient key, the fixture sealed to that key, and a release
/// rule for the simulated TEE's measurement; challenges live `lifetime`. Returns the broker, the
/// sealed model's directory and its manifest.
fn releasing_broker(work: &Path, lifetime: Duration) -> (InProcess, PathBuf, Manifest) {
    let (secret, public) = RecipientSecret::generate();
    let (sealed, manifest) = seal_to(work, &public);
    let policy = release_policy(work, MODEL_ID, &manifest.key_id, &simulated_measurement());
    (
        InProcess::start(work, secret, &policy, lifetime),
        sealed,
        manifest,
    )
}

/// A broker serving in this process.
struct InProcess {
    runtime: tokio::runtime::Runtime,
    broker: Arc<Broker>,
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    audit_dir: PathBuf,
}

impl InProcess {
    fn start(work: &Path, secret: RecipientSecret, policy: &Path, ttl: Duration) -> Self {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let audit_dir = work.join("broker-audit");
        let policy = ReleasePolicy::from_file(policy).unwrap();
        let (broker, listener) = runtime.block_on(async {
            let audit = AuditSink::open(
                &AuditConfig {
                    dir: audit_dir.clone(),
                    ..AuditConfig::default()
                },
                ContentMode::None,
                "inferno-keybroker/test",
            )
            .unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            (Arc::new(Broker::new(secret, policy, audit, ttl)), listener)
        });
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(inferno::keybroker::server::serve(
            listener,
            Arc::clone(&broker),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            runtime,
            broker,
            url,
            stop: Some(stop),
            audit_dir,
        }
    }

    /// Stops serving, writes the counted refusals and closes the audit log; returns its
    /// key-release events.
    fn stop(mut self) -> Vec<(bool, String)> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.runtime.block_on(self.broker.flush_refusals());
        self.runtime
            .block_on(self.broker.audit().shutdown("test over"))
            .unwrap();
        key_releases(&self.audit_dir)
    }
}

/// The appliance's start-up runtime data in the development profile (before the challenge).
fn base_runtime_data() -> RuntimeData {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(dev_policy_digest(), &mut digest).unwrap();
    RuntimeData::new(digest, "inferno/test")
}

fn simulated_evidence(mut doc: RuntimeData) -> Result<Evidence, String> {
    inferno::attest::collect_fresh_evidence(&AttestationConfig::development(), &mut doc)
        .map_err(|e| e.to_string())
}

fn key_request(manifest: &Manifest) -> KeyRequest {
    KeyRequest {
        model_id: MODEL_ID.into(),
        key_id: manifest.key_id.clone(),
        wrapped_key: manifest.wrapped_key.clone().unwrap(),
        tee: "sev-snp".into(),
    }
}

#[test]
fn a_released_key_opens_the_sealed_fixture_and_reproduces_the_golden_outputs() {
    let work = tempfile::tempdir().unwrap();
    let (broker, sealed, manifest) = releasing_broker(work.path(), Duration::from_secs(60));
    let key = broker
        .runtime
        .block_on(request_key(
            &broker.url,
            &key_request(&manifest),
            &base_runtime_data(),
            0,
            simulated_evidence,
        ))
        .expect("the broker releases the key");
    assert_eq!(key.id(), manifest.key_id);
    let releases = broker.stop();
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert!(releases[0].0, "{releases:?}");
    assert!(releases[0].1.contains("SIMULATED TEE"), "{releases:?}");

    let plain = committed_fixture("inferno-tiny");
    let (_, files) = open_sealed(&sealed, &key).expect("the released key opens the model");
    assert_eq!(files.digest(), &ModelDigest::of_dir(&plain).unwrap());
    let model = Model::from_files(&files, MODEL_ID.into()).unwrap();
    drop(files);
    let config = EngineConfig {
        max_batched_tokens: 128,
        kv_cache_bytes: 64 << 20,
        ..Default::default()
    };
    let engine = engine(&model, config);
    for (i, case) in golden(&plain).iter().enumerate() {
        let out = run(&engine, greedy(&case.input_ids, case.greedy_24.len()));
        assert_eq!(out.tokens, case.greedy_24, "case {i}");
    }
    engine.shutdown();
}

#[test]
fn a_rule_with_model_digests_releases_only_to_evidence_binding_one_of_them() {
    let work = tempfile::tempdir().unwrap();
    let (secret, public) = RecipientSecret::generate();
    let (_, manifest) = seal_to(work.path(), &public);
    let policy = release_policy(
        work.path(),
        MODEL_ID,
        &manifest.key_id,
        &simulated_measurement(),
    );
    let text = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(
        &policy,
        format!("{text}model_digests = [\"{}\"]\n", manifest.model_digest),
    )
    .unwrap();
    let broker = InProcess::start(work.path(), secret, &policy, Duration::from_secs(60));
    let ask = |digest: Option<String>| {
        let mut doc = base_runtime_data();
        doc.model_digest = digest;
        broker.runtime.block_on(request_key(
            &broker.url,
            &key_request(&manifest),
            &doc,
            0,
            simulated_evidence,
        ))
    };
    let key = ask(Some(manifest.model_digest.clone())).expect("released");
    assert_eq!(key.id(), manifest.key_id);
    for (digest, expected) in [
        (Some("00".repeat(32)), "model digest"),
        (None, "binds no model digest"),
    ] {
        match ask(digest) {
            Err(BrokerError::Refused { message, .. }) => {
                assert!(message.contains(expected), "{message}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    let released: Vec<bool> = broker.stop().iter().map(|r| r.0).collect();
    assert_eq!(released, [true, false, false]);
}

#[test]
fn the_broker_refuses_a_wrong_measurement_an_unknown_model_and_another_brokers_key() {
    let work = tempfile::tempdir().unwrap();
    let (secret, public) = RecipientSecret::generate();
    let (_, manifest) = seal_to(work.path(), &public);
    let policy = release_policy(work.path(), MODEL_ID, &manifest.key_id, &"ab".repeat(48));
    let broker = InProcess::start(work.path(), secret, &policy, Duration::from_secs(60));
    let ask = |request: KeyRequest| {
        broker.runtime.block_on(request_key(
            &broker.url,
            &request,
            &base_runtime_data(),
            3,
            simulated_evidence,
        ))
    };
    let refused = |result: Result<ModelKey, BrokerError>| match result {
        Err(BrokerError::Refused { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let wrong_measurement = refused(ask(key_request(&manifest)));
    assert!(
        wrong_measurement.contains("launch measurement")
            && wrong_measurement.contains(&simulated_measurement()),
        "{wrong_measurement}"
    );
    let mut other_model = key_request(&manifest);
    other_model.model_id = "another-model".into();
    let unknown = refused(ask(other_model));
    assert!(unknown.contains("not released by this broker"), "{unknown}");
    let releases = broker.stop();
    assert_eq!(releases.len(), 2, "{releases:?}");
    assert!(
        releases.iter().all(|(released, _)| !released),
        "{releases:?}"
    );
    assert!(releases[0].1.contains("launch measurement"), "{releases:?}");
    assert!(releases[1].1.contains("another-model"), "{releases:?}");

    // A model sealed to another broker: refused even though the policy would allow it.
    let work = tempfile::tempdir().unwrap();
    let (secret, _) = RecipientSecret::generate();
    let (_, elsewhere) = RecipientSecret::generate();
    let (_, manifest) = seal_to(work.path(), &elsewhere);
    let policy = release_policy(
        work.path(),
        MODEL_ID,
        &manifest.key_id,
        &simulated_measurement(),
    );
    let broker = InProcess::start(work.path(), secret, &policy, Duration::from_secs(60));
    let result = broker.runtime.block_on(request_key(
        &broker.url,
        &key_request(&manifest),
        &base_runtime_data(),
        0,
        simulated_evidence,
    ));
    let message = refused(result);
    assert!(message.contains("sealed for key broker"), "{message}");
    broker.stop();
}

/// Runs the exchange by hand: returns the challenge, the attest request and its answer.
async fn exchange(
    client: &reqwest::Client,
    url: &str,
    manifest: &Manifest,
) -> (AuthResponse, AttestRequest) {
    let challenge: AuthResponse = client
        .post(format!("{url}{AUTH_PATH}"))
        .json(&AuthRequest {
            version: PROTOCOL_VERSION.into(),
            tee: "sev-snp".into(),
            model_id: MODEL_ID.into(),
            key_id: manifest.key_id.clone(),
        })
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (_, public) = RecipientSecret::generate();
    let nonce = hex::decode(&challenge.nonce).unwrap();
    let doc =
        inferno::keybroker::client::release_runtime_data(&base_runtime_data(), &nonce, &public)
            .unwrap();
    let evidence = simulated_evidence(doc).unwrap();
    let request = AttestRequest {
        session: challenge.session.clone(),
        tee_pubkey: public.to_hex(),
        evidence: serde_json::to_value(&evidence).unwrap(),
        wrapped_key: manifest.wrapped_key.clone().unwrap(),
    };
    (challenge, request)
}

async fn attest(
    client: &reqwest::Client,
    url: &str,
    request: &AttestRequest,
) -> (u16, serde_json::Value) {
    let response = client
        .post(format!("{url}{ATTEST_PATH}"))
        .json(request)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[test]
fn a_replayed_or_stale_challenge_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let (broker, _, manifest) = releasing_broker(work.path(), Duration::from_secs(2));
    let client = reqwest::Client::new();
    broker.runtime.block_on(async {
        let (_, first) = exchange(&client, &broker.url, &manifest).await;
        let (status, body) = attest(&client, &broker.url, &first).await;
        assert_eq!(status, 200, "{body}");
        // The same request again: the session answered once already.
        let (status, body) = attest(&client, &broker.url, &first).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error"]["type"], "invalid_session", "{body}");
        // The old evidence under a fresh session: it does not bind the new nonce.
        let (fresh, _) = exchange(&client, &broker.url, &manifest).await;
        let replayed = AttestRequest {
            session: fresh.session,
            ..first.clone()
        };
        let (status, body) = attest(&client, &broker.url, &replayed).await;
        assert_eq!(status, 403, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("runtime_data.challenge"), "{message}");
        // A challenge answered after it expired.
        let (_, late) = exchange(&client, &broker.url, &manifest).await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let (status, body) = attest(&client, &broker.url, &late).await;
        assert_eq!(status, 401, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("expired"), "{message}");
    });
    let releases = broker.stop();
    let released: Vec<bool> = releases.iter().map(|r| r.0).collect();
    assert_eq!(released, [true, false, false, false], "{releases:?}");
}

/// Issue 47, defect 3: one client flooding challenges and junk attestations neither blocks an
/// appliance from another address nor costs a durable record each; its refusals are one
/// aggregated record naming the address and the count.
#[test]
fn a_flood_from_one_client_neither_blocks_an_appliance_nor_writes_a_record_each() {
    use inferno::keybroker::server::MAX_SESSIONS_PER_CLIENT;
    let work = tempfile::tempdir().unwrap();
    let (broker, _, manifest) = releasing_broker(work.path(), Duration::from_secs(60));
    let flooder = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    broker.runtime.block_on(async {
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for _ in 0..1100 {
            let status = flooder
                .post(format!("{}{AUTH_PATH}", broker.url))
                .json(&AuthRequest {
                    version: PROTOCOL_VERSION.into(),
                    tee: "sev-snp".into(),
                    model_id: MODEL_ID.into(),
                    key_id: manifest.key_id.clone(),
                })
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            *statuses.entry(status).or_default() += 1;
        }
        assert_eq!(
            statuses,
            [
                (200, MAX_SESSIONS_PER_CLIENT),
                (429, 1100 - MAX_SESSIONS_PER_CLIENT)
            ]
            .into(),
        );
        let junk = AttestRequest {
            session: "0".repeat(32),
            tee_pubkey: "00".repeat(32),
            evidence: serde_json::json!({}),
            wrapped_key: manifest.wrapped_key.clone().unwrap(),
        };
        for _ in 0..90 {
            let (status, body) = attest(&flooder, &broker.url, &junk).await;
            assert_eq!(status, 401, "{body}");
        }
        // The appliance, from another address, starts at its first attempt.
        request_key(
            &broker.url,
            &key_request(&manifest),
            &base_runtime_data(),
            0,
            simulated_evidence,
        )
        .await
        .expect("the broker releases the key despite the flood");
    });
    let releases = broker.stop();
    assert_eq!(releases.len(), 2, "{releases:?}");
    assert!(releases[0].0, "{releases:?}");
    let (released, reason) = &releases[1];
    assert!(!released);
    let refusals = 1100 - MAX_SESSIONS_PER_CLIENT + 90;
    assert!(
        reason.starts_with(&format!("{refusals} refusals from 127.0.0.2 in the last")),
        "{reason}"
    );
}

// ---- the command line: `inferno keybroker`, `inferno seal --recipient`, `inferno serve` ----

/// Issue 47, defect 9: the README's key-broker commands and release policy, word for word but
/// for the host's paths (`/srv/kbs` is a temporary directory), the listen address (a free
/// loopback port) and the placeholders in angle brackets: the broker starts under
/// `appraisal = "production"`, and its audit log verifies.
#[test]
fn the_readme_key_broker_commands_start_and_verify() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("### Serving a sealed model through the key broker")
        .nth(1)
        .expect("the README's key-broker section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("srv/kbs");
    std::fs::create_dir_all(&root).unwrap();
    let here = |line: &str| {
        line.replace("/srv/kbs", root.to_str().unwrap())
            .replace("0.0.0.0:8700", "127.0.0.1:0")
    };
    let policy: String = block
        .lines()
        .filter_map(|line| line.strip_prefix("#   "))
        .map(|line| {
            line.replace("<key id>", &"ab".repeat(16))
                .replace("<launch measurement>", &"cd".repeat(48))
                .replace(
                    "<SHA-256 of the appliance's server policy>",
                    &"ef".repeat(32),
                )
                + "\n"
        })
        .collect();
    assert!(
        policy.starts_with("appraisal = \"production\"\n"),
        "{policy}"
    );
    std::fs::write(root.join("release.toml"), &policy).unwrap();
    std::fs::write(
        root.join("bundle.json"),
        inferno_attestation::bundle::CollateralBundle::empty("2026-01-01T00:00:00Z".into())
            .to_json(),
    )
    .unwrap();
    let command = |prefix: &str| {
        let line = block
            .lines()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line"));
        let line = here(line);
        line.split_whitespace()
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let broker = command("inferno keybroker ");
    let broker: Vec<&str> = broker.iter().map(String::as_str).collect();
    let (child, banner) = spawn_until_listening(&broker);
    assert!(banner.contains("models:      llama"), "{banner}");
    terminate(child);
    let verify = command("inferno audit verify ");
    let verify: Vec<&str> = verify.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = inferno(&verify);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}

/// The arguments of `inferno serve` on `sealed` through the broker at `url`.
fn broker_serve_args<'a>(sealed: &'a Path, config: &'a Path, url: &'a str) -> Vec<&'a str> {
    let mut args = serve_args(sealed, config);
    args.extend(["--key-broker", url]);
    args
}

#[test]
fn serve_through_the_key_broker_and_verify_the_brokers_audit_log() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let keys = w.join("keys");
    // The broker's key pair first (the policy names the key id, known only after sealing).
    let (_, public, created) = load_or_create_keys(&keys).unwrap();
    assert!(created);
    let sealed = w.join("sealed");
    let (code, stdout, stderr) = inferno(&[
        "seal",
        "--model",
        committed_fixture("inferno-tiny").to_str().unwrap(),
        "--out",
        sealed.to_str().unwrap(),
        "--recipient",
        keys.join("broker.pub").to_str().unwrap(),
        "--model-id",
        MODEL_ID,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains(&public.to_hex()), "{stdout}");
    let (manifest, _) = Manifest::read(&sealed).unwrap();
    let policy = release_policy(w, MODEL_ID, &manifest.key_id, &simulated_measurement());
    let broker_audit = w.join("broker-audit");
    let (broker, banner) = spawn_until_listening(&[
        "keybroker",
        "--listen",
        "127.0.0.1:0",
        "--keys",
        keys.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--audit",
        broker_audit.to_str().unwrap(),
    ]);
    assert!(banner.contains(&public.to_hex()), "{banner}");
    let url = banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("listening:"))
        .unwrap()
        .trim()
        .to_owned();

    // Released: the server serves the plaintext's digest and records the release.
    let run1 = w.join("run1");
    std::fs::create_dir(&run1).unwrap();
    let config = dev_config(&run1, "");
    let (server, banner) = spawn_until_listening(&broker_serve_args(&sealed, &config, &url));
    let digest = ModelDigest::of_dir(&committed_fixture("inferno-tiny"))
        .unwrap()
        .hex;
    assert!(banner.contains(&digest), "{banner}");
    terminate(server);
    let releases = key_releases(&run1.join("audit"));
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert!(
        releases[0].0 && releases[0].1.contains("key broker"),
        "{releases:?}"
    );

    // A sealed model the broker's policy does not release: refused, one line, exit 1.
    let other = w.join("other");
    let (code, _, stderr) = inferno(&[
        "seal",
        "--model",
        committed_fixture("inferno-tiny").to_str().unwrap(),
        "--out",
        other.to_str().unwrap(),
        "--recipient",
        keys.join("broker.pub").to_str().unwrap(),
        "--model-id",
        "not-allowed",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let run2 = w.join("run2");
    std::fs::create_dir(&run2).unwrap();
    let config = dev_config(&run2, "");
    let (error, stderr, _) = refused_serve(
        &broker_serve_args(&other, &config, &url),
        &run2.join("audit"),
    );
    assert!(
        error.contains("sealed model refused") && error.contains("not released by this broker"),
        "{stderr}"
    );

    // The broker's audit log: one release, one refusal, and it verifies.
    terminate(broker);
    let releases = key_releases(&broker_audit);
    let released: Vec<bool> = releases.iter().map(|r| r.0).collect();
    assert_eq!(released, [true, false], "{releases:?}");
    let (code, stdout, stderr) = inferno(&["audit", "verify", broker_audit.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}

#[test]
fn serve_refuses_when_the_key_broker_is_down() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (_, public) = RecipientSecret::generate();
    let (sealed, _) = seal_to(w, &public);
    // A port nothing listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let config = dev_config(
        w,
        &format!("[model.key]\nsource = \"broker\"\nurl = \"{url}\"\nretries = 1\n"),
    );
    let (error, stderr, reason) = refused_serve(&serve_args(&sealed, &config), &w.join("audit"));
    assert!(error.contains("unavailable after 2 attempts"), "{stderr}");
    assert!(reason.contains("unavailable"), "{reason}");
}

/// Issue 47, defect 5: a signal while the model is loading ends start-up. Here the slow part of
/// loading is a key broker that accepts the connection and never answers (each request would
/// wait 30 s, with retries): SIGTERM then exits at once, cleanly.
#[test]
fn a_signal_while_waiting_for_a_silent_key_broker_exits_at_once() {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let keys = w.join("keys");
    load_or_create_keys(&keys).unwrap();
    let sealed = w.join("sealed");
    let (code, _, stderr) = inferno(&[
        "seal",
        "--model",
        committed_fixture("inferno-tiny").to_str().unwrap(),
        "--out",
        sealed.to_str().unwrap(),
        "--recipient",
        keys.join("broker.pub").to_str().unwrap(),
        "--model-id",
        MODEL_ID,
    ]);
    assert_eq!(code, Some(0), "{stderr}");

    // The silent broker: connections are accepted and held, never answered.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (accepted, asked) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().map_while(Result::ok) {
            held.push(stream);
            let _ = accepted.send(());
        }
    });

    let config = dev_config(w, "");
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(broker_serve_args(&sealed, &config, &url))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn inferno serve");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(std::sync::Mutex::new(String::new()));
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    let log = || log.lock().unwrap().clone();
    asked
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the server never asked the broker:\n{}", log()));
    // Start-up is now waiting on the broker.
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "{}", log());
    let signalled = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!(
                "still waiting for the broker 10 s after SIGTERM:\n{}",
                log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "exited after {took:?}:\n{}",
        log()
    );
    assert_eq!(exited.code(), Some(0), "{}", log());
    assert!(
        log().contains("signal received while opening the sealed model; exiting"),
        "{}",
        log()
    );
}
