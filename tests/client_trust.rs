//! The client chain of trust against the real server (`inferno serve`, simulated TEE, embedded
//! model, CPU backend) under `policy/client-development.toml`: `inferno verify`, the
//! `inferno-client` library and `inferno proxy`, and the attacks they must reject, each naming
//! the failing check. The relays are real TCP/TLS programs on loopback.

mod proxy_support;
mod spawn_support;

use proxy_support::{Proxy, development_policy};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inferno_attestation::runtime_data::EVIDENCE_EXTENSION_OID_DER;
use inferno_client::policy::LoadedClientPolicy;
use inferno_client::{Client, Observation, Target, TrustReport};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use x509_parser::prelude::{FromDer as _, X509Certificate};

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

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn inferno(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .output()
        .expect("runs inferno")
}

/// A running `inferno serve` (development profile); stopped on drop.
struct Served {
    child: Child,
    base: String,
    _work: tempfile::TempDir,
}

impl Served {
    fn start() -> Self {
        let work = tempfile::tempdir().expect("tempdir");
        let (child, base) = spawn_support::spawn_server(
            "[attestation]\nprofile = \"development\"\n",
            work.path(),
            "warn",
        );
        Self {
            child,
            base,
            _work: work,
        }
    }

    fn target(&self) -> Target {
        Target::parse(&self.base).expect("server address")
    }

    fn addr(&self) -> SocketAddr {
        self.base
            .trim_start_matches("https://")
            .parse()
            .expect("socket address")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn development_client() -> Client {
    Client::new(
        LoadedClientPolicy::from_file(&development_policy()).expect("client policy"),
        None,
    )
}

/// The failed checks' names.
fn failed(report: &TrustReport) -> Vec<&str> {
    report.failures().map(|c| c.id.as_str()).collect()
}

/// A client policy: the development one with `extra` top-level keys.
fn policy_with(dir: &Path, name: &str, extra: &str) -> PathBuf {
    let base = std::fs::read_to_string(development_policy()).expect("policy");
    let text = base.replacen(
        "accept_simulated = true\n",
        &format!("accept_simulated = true\n{extra}\n"),
        1,
    );
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write policy");
    path
}

/// `inferno verify --json`: the exit code and the report.
fn verify_json(server: &str, policy: &Path) -> (i32, serde_json::Value) {
    let out = inferno(&[
        "verify",
        server,
        "--policy",
        policy.to_str().expect("utf8"),
        "--json",
    ]);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().expect("exit code"), report)
}

fn failed_json(report: &serde_json::Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["passed"] == false)
        .map(|c| c["id"].as_str().expect("id").to_owned())
        .collect()
}

#[test]
fn verify_trusts_the_simulated_server_and_names_every_check() {
    let served = Served::start();
    let out = inferno(&[
        "verify",
        &served.base,
        "--policy",
        development_policy().to_str().expect("utf8"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("verdict: TRUSTED (SIMULATED TEE"), "{text}");
    for check in CHECKS {
        assert!(
            text.contains(&format!("[pass] {check}: ")),
            "{check} missing:\n{text}"
        );
    }

    let (code, report) = verify_json(&served.base, &development_policy());
    assert_eq!(code, 0);
    assert_eq!(report["verdict"], "pass");
    assert_eq!(report["simulated"], true);
    let ids: Vec<&str> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| c["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, CHECKS);
    assert_eq!(
        report["measurement"].as_str().expect("measurement").len(),
        96
    );
    assert_eq!(report["model_digest"].as_str().expect("model").len(), 64);
}

#[test]
fn verify_rejects_a_wrong_measurement_server_policy_or_model_naming_the_check() {
    let served = Served::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, trusted) = verify_json(&served.base, &development_policy());
    let server_policy = trusted["server_policy_sha256"]
        .as_str()
        .expect("policy digest");
    let model = trusted["model_digest"].as_str().expect("model digest");
    let measurement = trusted["measurement"].as_str().expect("measurement");

    let cases = [
        (
            "measurement.toml",
            format!("measurements = [\"{}\"]", "ab".repeat(48)),
            "policy.measurement",
        ),
        (
            "server-policy.toml",
            format!("server_policy_sha256 = [\"{}\"]", "cd".repeat(32)),
            "policy.server_policy_digest",
        ),
        (
            "model.toml",
            format!("model_digests = [\"{}\"]", "ef".repeat(32)),
            "policy.model_digest",
        ),
    ];
    for (name, extra, check) in cases {
        let policy = policy_with(dir.path(), name, &extra);
        let (code, report) = verify_json(&served.base, &policy);
        assert_eq!(code, 1, "{check}: {report}");
        assert_eq!(report["verdict"], "reject");
        assert_eq!(failed_json(&report), [check], "{report}");
        let text = inferno(&[
            "verify",
            &served.base,
            "--policy",
            policy.to_str().expect("utf8"),
        ]);
        assert_eq!(text.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&text.stdout).contains(&format!("[FAIL] {check}: ")),
            "{}",
            String::from_utf8_lossy(&text.stdout)
        );
    }

    // The right values pass as allow-lists.
    let pinned = policy_with(
        dir.path(),
        "pinned.toml",
        &format!(
            "measurements = [\"{measurement}\"]\nserver_policy_sha256 = [\"{server_policy}\"]\nmodel_digests = [\"{model}\"]"
        ),
    );
    let (code, report) = verify_json(&served.base, &pinned);
    assert_eq!(code, 0, "{report}");
}

#[test]
fn verify_reports_bad_input_on_one_line() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "verify",
                "https://127.0.0.1:9",
                "--policy",
                "/nonexistent/policy.toml",
            ],
            "cannot read client policy",
        ),
        (
            &[
                "verify",
                "http://127.0.0.1:9",
                "--policy",
                "policy/client-development.toml",
            ],
            "scheme must be https",
        ),
        (
            &[
                "verify",
                "https://127.0.0.1",
                "--policy",
                "policy/client-development.toml",
            ],
            "port is required",
        ),
        (
            &[
                "verify",
                "https://127.0.0.1:9",
                "--policy",
                "policy/development.toml",
            ],
            "client policy",
        ),
    ];
    for (args, expected) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
            .args(args)
            .current_dir(repo())
            .output()
            .expect("runs inferno");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty());
    }
    // Nothing listens on port 9: an unreachable server is an error, not a verdict.
    let out = inferno(&[
        "verify",
        "https://127.0.0.1:9",
        "--policy",
        development_policy().to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[test]
fn replayed_evidence_and_replayed_nonces_are_refused() {
    let served = Served::start();
    let rt = runtime();
    let client = development_client();
    let target = served.target();
    let nonce: [u8; 32] = rand::random();
    let (first, _a) = rt
        .block_on(client.exchange(&target, &nonce))
        .expect("first exchange");
    let (second, _b) = rt
        .block_on(client.exchange(&target, &rand::random::<[u8; 32]>()))
        .expect("second exchange");
    assert!(
        client.appraise(&first).trusted(),
        "{}",
        client.appraise(&first)
    );
    assert!(client.appraise(&second).trusted());

    // Fresh evidence from another connection, replayed on this one.
    let replayed = Observation {
        fresh_evidence: first.fresh_evidence.clone(),
        ..second.clone()
    };
    let report = client.appraise(&replayed);
    assert_eq!(failed(&report), ["fresh.challenge"], "{report}");
    assert!(
        report
            .failure_summary()
            .contains("another connection or another nonce")
    );

    // An answer to an earlier nonce, on the connection it was produced for.
    let old_nonce = Observation {
        nonce: rand::random::<[u8; 32]>().to_vec(),
        ..first.clone()
    };
    assert_eq!(failed(&client.appraise(&old_nonce)), ["fresh.challenge"]);

    // The server refuses a nonce it has answered before.
    let Err(err) = rt.block_on(client.exchange(&target, &nonce)) else {
        panic!("a replayed nonce is refused");
    };
    let message = err.to_string();
    assert!(message.contains("HTTP 400"), "{message}");

    // Another certificate (a plain self-signed one) on this connection.
    let plain = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let swapped = Observation {
        certificate: plain.cert.der().to_vec(),
        ..first
    };
    let report = client.appraise(&swapped);
    let failures = failed(&report);
    assert!(
        failures.contains(&"tls.certificate_evidence"),
        "{failures:?}"
    );
    assert!(failures.contains(&"tls.spki"), "{failures:?}");
}

#[test]
fn relays_that_terminate_tls_are_rejected_and_a_plain_tcp_relay_is_not() {
    let served = Served::start();
    let rt = runtime();
    let policy = development_policy();

    // A TCP relay that only moves bytes: the TLS session is still the server's.
    let relay = rt.block_on(Relay::start(served.addr(), RelayMode::Pass, None));
    let (code, report) = verify_json(&relay.base(), &policy);
    assert_eq!(code, 0, "{report}");

    // A relay that terminates TLS with its own key and a certificate carrying the server's
    // evidence extension, and forwards the client's bytes over its own TLS session.
    let impostor = rt.block_on(Impostor::new(&served));
    let relay = rt.block_on(Relay::start(
        served.addr(),
        RelayMode::Terminate,
        Some(Arc::new(impostor)),
    ));
    let (code, report) = verify_json(&relay.base(), &policy);
    assert_eq!(code, 1, "{report}");
    let failures = failed_json(&report);
    assert!(failures.contains(&"tls.spki".to_owned()), "{report}");
    assert!(failures.contains(&"fresh.challenge".to_owned()), "{report}");
    assert!(
        !failures.contains(&"tls.certificate_evidence".to_owned()),
        "{report}"
    );

    // A relay that answers the attestation request with fresh evidence it obtained over
    // another connection (for the same nonce it is asked, as a relay could).
    let impostor = rt.block_on(Impostor::new(&served));
    let relay = rt.block_on(Relay::start(
        served.addr(),
        RelayMode::Replay,
        Some(Arc::new(impostor)),
    ));
    let (code, report) = verify_json(&relay.base(), &policy);
    assert_eq!(code, 1, "{report}");
    assert!(
        failed_json(&report).contains(&"fresh.challenge".to_owned()),
        "{report}"
    );
}

#[test]
fn the_proxy_forwards_only_to_a_verified_upstream_and_recovers() {
    let served = Served::start();
    let rt = runtime();
    let impostor = Arc::new(rt.block_on(Impostor::new(&served)));
    let relay = rt.block_on(Relay::start(served.addr(), RelayMode::Pass, Some(impostor)));
    let (_, trusted) = verify_json(&served.base, &development_policy());
    let proxy = Proxy::start(&relay.base(), &[]);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let models: serde_json::Value = rt.block_on(async {
        http.get(format!("{}/v1/models", proxy.base))
            .send()
            .await
            .expect("models")
            .json()
            .await
            .expect("json")
    });
    let model_id = models["data"][0]["id"]
        .as_str()
        .expect("model id")
        .to_owned();
    let chat_model = |http: &reqwest::Client| {
        let http = http.clone();
        let url = format!("{}/v1/chat/completions", proxy.base);
        let model = model_id.clone();
        async move {
            let response = http
                .post(url)
                .json(&serde_json::json!({
                    "model": model,
                    "messages": [{"role": "user", "content": "Hello"}],
                    "max_tokens": 4,
                }))
                .send()
                .await
                .expect("the proxy answers");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body: serde_json::Value = response.json().await.expect("JSON body");
            (status, headers, body)
        }
    };

    let (status, headers, body) = rt.block_on(chat_model(&http));
    assert_eq!(status, 200, "{body}");
    // The verified connection is reused: a second request needs no new verification.
    let (status, _, body) = rt.block_on(chat_model(&http));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        relay.connections(),
        1,
        "each request verified a new connection"
    );
    assert_eq!(
        headers["inferno-verified-measurement"].to_str().unwrap(),
        trusted["measurement"].as_str().unwrap()
    );
    assert_eq!(
        headers["inferno-verified-model"].to_str().unwrap(),
        trusted["model_digest"].as_str().unwrap()
    );

    // The upstream certificate changes (an impostor takes the relay's place mid-session): the
    // proxy's next upstream connection fails verification and it answers 502, sending nothing.
    relay.switch(RelayMode::Terminate);
    for _ in 0..2 {
        let (status, _, body) = rt.block_on(chat_model(&http));
        assert_eq!(status, 502, "{body}");
        assert_eq!(
            body["error"]["code"], "upstream_verification_failed",
            "{body}"
        );
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("tls.spki"), "{message}");
    }
    assert_eq!(
        relay.forwarded_requests(),
        0,
        "a request reached the impostor's upstream"
    );

    // The genuine server is back: the proxy verifies a new connection and serves again.
    relay.switch(RelayMode::Pass);
    let (status, headers, body) = rt.block_on(chat_model(&http));
    assert_eq!(status, 200, "{body}");
    assert!(headers.contains_key("inferno-verified-model"));
}

#[test]
fn the_proxy_answers_502_and_forwards_nothing_to_an_unverifiable_upstream() {
    let rt = runtime();
    // Nothing listens on port 9: no TLS session, so `upstream_unreachable`.
    let proxy = Proxy::start("https://127.0.0.1:9", &[]);
    let http = reqwest::Client::new();
    let ask = |base: &str| {
        let request = http
            .post(format!("{base}/v1/chat/completions"))
            .json(&serde_json::json!({
                "model": "any",
                "messages": [{"role": "user", "content": "a prompt that must not leave"}],
            }))
            .send();
        async move {
            let response = request.await.expect("the proxy answers");
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.expect("OpenAI error JSON");
            (status, body)
        }
    };
    let (status, body) = rt.block_on(ask(&proxy.base));
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "upstream_unreachable", "{body}");
    assert!(
        !body["error"]["message"]
            .as_str()
            .expect("message")
            .contains('\n')
    );
    drop(proxy);

    // A TLS server whose certificate carries no evidence, answering the attestation request with
    // genuine (simulated) evidence for another key: `upstream_verification_failed`, naming the
    // checks, and no request but the attestation ones reaches it.
    let upstream = rt.block_on(UnattestedServer::start());
    let proxy = Proxy::start(&format!("https://{}", upstream.addr), &[]);
    for _ in 0..2 {
        let (status, body) = rt.block_on(ask(&proxy.base));
        assert_eq!(status, 502, "{body}");
        assert_eq!(body["error"]["code"], "upstream_verification_failed");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("tls.certificate_evidence"), "{message}");
        assert!(message.contains("fresh.challenge"), "{message}");
    }
    let seen = upstream.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.iter()
            .all(|line| line == "POST /v1/attestation HTTP/1.1"),
        "{seen:?}"
    );
}

/// A TLS server with a plain self-signed certificate (no evidence extension) that answers
/// `POST /v1/attestation` with simulated evidence naming no key, and records every request line.
struct UnattestedServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl UnattestedServer {
    async fn start() -> Self {
        use inferno_attestation::collect::{collect_evidence, simulated::SimulatedSnp};
        use inferno_attestation::runtime_data::RuntimeData;
        let evidence = collect_evidence(
            &SimulatedSnp::new().expect("simulated TEE"),
            &RuntimeData::new([0; 32], "unattested"),
        )
        .expect("evidence");
        let answer = serde_json::json!({ "evidence": evidence }).to_string();
        let identity =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let acceptor = tls_acceptor(identity.cert.der().to_vec(), &identity.signing_key);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen, answer) =
                    (acceptor.clone(), Arc::clone(&seen), answer.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Some((request_line, _)) = read_whole_request(&mut tls).await else {
                        return;
                    };
                    seen.lock().unwrap().push(request_line);
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = tls.write_all(response.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self {
            addr,
            requests,
            task,
        }
    }
}

impl Drop for UnattestedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[test]
fn the_proxy_streams_from_a_verified_upstream_refuses_a_swapped_certificate_and_recovers() {
    let rt = runtime();
    let upstream = rt.block_on(AttestedUpstream::start());
    let proxy = Proxy::start(&format!("https://{}", upstream.addr), &[]);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let ask = || {
        let request = http
            .post(format!("{}/v1/chat/completions", proxy.base))
            .header("authorization", "Bearer k")
            .json(&serde_json::json!({"model": "m", "stream": true, "messages": []}));
        async move { request.send().await }
    };

    // Verified: the answer streams through, the first event before the upstream sends the second.
    let mut response = rt.block_on(ask()).expect("the proxy answers");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["inferno-verified-measurement"],
        hex::encode(inferno_attestation::collect::simulated::default_measurement()).as_str()
    );
    assert_eq!(response.headers()["inferno-verified-model"], UPSTREAM_MODEL);
    let first = rt
        .block_on(response.chunk())
        .expect("first chunk")
        .expect("a chunk");
    assert_eq!(&first[..], b"data: one\n\n");
    upstream.release.notify_one();
    let rest = rt.block_on(response.bytes()).expect("rest of the stream");
    assert_eq!(&rest[..], b"data: two\n\n");
    assert_eq!(
        upstream.forwarded.lock().unwrap().as_slice(),
        ["POST /v1/chat/completions HTTP/1.1 authorization=Bearer k"]
    );

    // The upstream now presents another key with the same evidence extension: every request is
    // refused 502 naming tls.spki, and none reaches the upstream.
    upstream.set_genuine(false);
    for _ in 0..2 {
        let response = rt.block_on(ask()).expect("the proxy answers");
        assert_eq!(response.status().as_u16(), 502);
        let body: serde_json::Value = rt.block_on(response.json()).expect("error JSON");
        assert_eq!(body["error"]["code"], "upstream_verification_failed");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("tls.spki"), "{message}");
    }
    assert_eq!(upstream.forwarded.lock().unwrap().len(), 1);

    // The genuine key is back: verified again, served again.
    upstream.set_genuine(true);
    let response = rt.block_on(ask()).expect("the proxy answers");
    assert_eq!(response.status().as_u16(), 200);
    upstream.release.notify_one();
    let body = rt.block_on(response.bytes()).expect("body");
    assert_eq!(&body[..], b"data: one\n\ndata: two\n\n");
    assert_eq!(upstream.forwarded.lock().unwrap().len(), 2);
}

/// Issue 47, defect 1: concurrent first requests through a new proxy all succeed, and the
/// proxy's upstream connections share one verification (one challenge) while they present the
/// same certificate; a connection presenting another certificate is verified again.
#[test]
fn concurrent_first_requests_through_a_new_proxy_share_one_verification() {
    let rt = runtime();
    let upstream = rt.block_on(AttestedUpstream::start());
    upstream
        .hold
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let proxy = Proxy::start(&format!("https://{}", upstream.addr), &[]);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let statuses: Vec<u16> = rt.block_on(async {
        let requests = (0..24).map(|_| {
            let request = http
                .post(format!("{}/v1/chat/completions", proxy.base))
                .json(&serde_json::json!({"model": "m", "messages": []}));
            async move {
                let response = request.send().await.expect("the proxy answers");
                let status = response.status().as_u16();
                let _ = response.bytes().await;
                status
            }
        });
        futures_util::future::join_all(requests).await
    });
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    // Every request closed its upstream connection, so 24 were opened; one was challenged.
    assert_eq!(upstream.forwarded.lock().unwrap().len(), 24);
    assert_eq!(
        upstream
            .challenges
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // Another certificate is verified in full (and refused); the genuine one again passes,
    // after a new verification because the failed one replaced the cached one.
    let ask = || {
        let request = http
            .post(format!("{}/v1/chat/completions", proxy.base))
            .json(&serde_json::json!({"model": "m", "messages": []}));
        rt.block_on(async move {
            let response = request.send().await.expect("the proxy answers");
            let status = response.status().as_u16();
            let _ = response.bytes().await;
            status
        })
    };
    upstream.set_genuine(false);
    assert_eq!(ask(), 502);
    assert_eq!(
        upstream
            .challenges
            .load(std::sync::atomic::Ordering::SeqCst),
        2
    );
    upstream.set_genuine(true);
    assert_eq!(ask(), 200);
    assert_eq!(
        upstream
            .challenges
            .load(std::sync::atomic::Ordering::SeqCst),
        3
    );
}

/// Issue 47, defect 1: 24 concurrent first requests through a new proxy to the real server
/// (default challenge budget, burst 16) all succeed.
#[test]
fn concurrent_first_requests_through_a_new_proxy_to_the_server_all_succeed() {
    let served = Served::start();
    let rt = runtime();
    let proxy = Proxy::start(&served.base, &[]);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let statuses: Vec<u16> = rt.block_on(async {
        let requests = (0..24).map(|_| {
            let request = http.get(format!("{}/v1/models", proxy.base)).send();
            async move { request.await.expect("the proxy answers").status().as_u16() }
        });
        futures_util::future::join_all(requests).await
    });
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
}

/// The model digest the test upstream's evidence names.
const UPSTREAM_MODEL: &str = "1111111111111111111111111111111111111111111111111111111111111111";

/// A TLS upstream that speaks the client side's protocol with the simulated TEE: its certificate
/// carries start-up evidence binding its key, and `POST /v1/attestation` answers evidence bound to
/// the nonce and this connection's exporter (computed by rustls on the server side). It stands in
/// for the server so that the proxy's own behaviour is tested on any machine; the tests above run
/// against the real `inferno serve`. Other requests get a two-event stream whose second event
/// waits for `release`, and close the connection. With `genuine` false, new connections present
/// another key under the same evidence (a swapped certificate).
struct AttestedUpstream {
    addr: SocketAddr,
    genuine: Arc<std::sync::atomic::AtomicBool>,
    release: Arc<tokio::sync::Notify>,
    /// Whether the second event waits for `release` (otherwise it follows at once).
    hold: Arc<std::sync::atomic::AtomicBool>,
    forwarded: Arc<Mutex<Vec<String>>>,
    /// How many `POST /v1/attestation` challenges were answered.
    challenges: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl AttestedUpstream {
    async fn start() -> Self {
        use inferno_attestation::collect::{collect_evidence, simulated::SimulatedSnp};
        use inferno_attestation::runtime_data::{RuntimeData, challenge_binding};
        use sha2::Digest as _;
        let key = rcgen::KeyPair::generate().expect("key");
        let mut startup = RuntimeData::new([0x22; 32], "inferno/test-upstream");
        startup.tls_spki_sha256 = Some(hex::encode(sha2::Sha256::digest(
            rcgen::PublicKeyData::subject_public_key_info(&key),
        )));
        startup.model_digest = Some(UPSTREAM_MODEL.to_owned());
        let tee = SimulatedSnp::new().expect("simulated TEE");
        let evidence =
            serde_json::to_vec(&collect_evidence(&tee, &startup).expect("evidence")).expect("JSON");
        let genuine_acceptor = tls_acceptor(evidence_certificate(&key, &evidence), &key);
        let other_key = rcgen::KeyPair::generate().expect("key");
        let swapped_acceptor =
            tls_acceptor(evidence_certificate(&other_key, &evidence), &other_key);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let genuine = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let release = Arc::new(tokio::sync::Notify::new());
        let forwarded = Arc::new(Mutex::new(Vec::new()));
        let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let challenges = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (use_genuine, gate, seen, holding, answered) = (
            Arc::clone(&genuine),
            Arc::clone(&release),
            Arc::clone(&forwarded),
            Arc::clone(&hold),
            Arc::clone(&challenges),
        );
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = if use_genuine.load(std::sync::atomic::Ordering::SeqCst) {
                    genuine_acceptor.clone()
                } else {
                    swapped_acceptor.clone()
                };
                let (startup, gate, seen) = (startup.clone(), Arc::clone(&gate), Arc::clone(&seen));
                let (holding, answered) = (Arc::clone(&holding), Arc::clone(&answered));
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let tee = SimulatedSnp::new().expect("simulated TEE");
                    while let Some((head, body)) = read_request_head(&mut tls).await {
                        let request_line = head.lines().next().unwrap_or_default().to_owned();
                        if request_line == "POST /v1/attestation HTTP/1.1" {
                            answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let nonce = attestation_nonce(&body);
                            let mut exporter = [0u8; 32];
                            tls.get_ref()
                                .1
                                .export_keying_material(
                                    &mut exporter,
                                    inferno_attestation::runtime_data::TLS_EXPORTER_LABEL,
                                    None,
                                )
                                .expect("exporter");
                            let mut document = startup.clone();
                            document
                                .set_challenge_bindings([challenge_binding(&nonce, &exporter)])
                                .expect("bindings");
                            let evidence = collect_evidence(&tee, &document).expect("evidence");
                            let answer = serde_json::json!({ "evidence": evidence }).to_string();
                            let response = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                                answer.len()
                            );
                            if tls.write_all(response.as_bytes()).await.is_err() {
                                return;
                            }
                            continue;
                        }
                        let authorization = head
                            .lines()
                            .find_map(|l| l.strip_prefix("authorization: "))
                            .unwrap_or("(none)")
                            .to_owned();
                        seen.lock()
                            .unwrap()
                            .push(format!("{request_line} authorization={authorization}"));
                        let _ = tls
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\nb\r\ndata: one\n\n\r\n")
                            .await;
                        let _ = tls.flush().await;
                        if holding.load(std::sync::atomic::Ordering::SeqCst) {
                            gate.notified().await;
                        }
                        let _ = tls.write_all(b"b\r\ndata: two\n\n\r\n0\r\n\r\n").await;
                        let _ = tls.shutdown().await;
                        return;
                    }
                });
            }
        });
        Self {
            addr,
            genuine,
            release,
            hold,
            forwarded,
            challenges,
            task,
        }
    }

    fn set_genuine(&self, genuine: bool) {
        self.genuine
            .store(genuine, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for AttestedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a relay does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RelayMode {
    /// Moves bytes between the client and the server (TLS end to end).
    Pass,
    /// Terminates TLS with its own key and forwards the plaintext over its own TLS session.
    Terminate,
    /// Terminates TLS and answers the attestation request with evidence it obtained over
    /// another connection.
    Replay,
}

/// A loopback relay in front of the server whose mode the test switches; switching closes the
/// connections it holds.
struct Relay {
    addr: SocketAddr,
    state: Arc<Mutex<RelayState>>,
    task: tokio::task::JoinHandle<()>,
}

struct RelayState {
    mode: RelayMode,
    generation: u64,
    forwarded_requests: usize,
    connections: usize,
}

impl Relay {
    async fn start(upstream: SocketAddr, mode: RelayMode, impostor: Option<Arc<Impostor>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(RelayState {
            mode,
            generation: 0,
            forwarded_requests: 0,
            connections: 0,
        }));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (mode, generation) = {
                    let mut s = shared.lock().unwrap();
                    s.connections += 1;
                    (s.mode, s.generation)
                };
                let shared = Arc::clone(&shared);
                let impostor = impostor.clone();
                tokio::spawn(async move {
                    let work =
                        relay_connection(client, upstream, mode, impostor, Arc::clone(&shared));
                    let watch = async {
                        loop {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            if shared.lock().unwrap().generation != generation {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = work => {}
                        _ = watch => {}
                    }
                });
            }
        });
        Self { addr, state, task }
    }

    fn base(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn switch(&self, mode: RelayMode) {
        let mut s = self.state.lock().unwrap();
        s.mode = mode;
        s.generation += 1;
        drop(s);
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Connections the relay accepted.
    fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    /// Requests other than the attestation request that a terminating relay passed upstream.
    fn forwarded_requests(&self) -> usize {
        self.state.lock().unwrap().forwarded_requests
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mode: RelayMode,
    impostor: Option<Arc<Impostor>>,
    state: Arc<Mutex<RelayState>>,
) {
    match mode {
        RelayMode::Pass => {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
        RelayMode::Terminate | RelayMode::Replay => {
            let impostor = impostor.expect("a terminating relay has an impostor identity");
            let Ok(mut tls) = impostor.acceptor.accept(client).await else {
                return;
            };
            if mode == RelayMode::Replay {
                let Some(request) = read_request(&mut tls).await else {
                    return;
                };
                let nonce = attestation_nonce(&request);
                let answer = impostor.fresh_answer(&nonce).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.flush().await;
            }
            let Ok(mut server) = impostor.connect_upstream(upstream).await else {
                return;
            };
            // Count forwarded requests other than the attestation one.
            let mut buf = vec![0u8; 64 * 1024];
            let mut seen_attestation = mode == RelayMode::Replay;
            loop {
                tokio::select! {
                    read = tls.read(&mut buf) => {
                        let Ok(n) = read else { return };
                        if n == 0 { return; }
                        let chunk = &buf[..n];
                        if chunk.starts_with(b"POST ") || chunk.starts_with(b"GET ") {
                            if chunk.starts_with(b"POST /v1/attestation ") && !seen_attestation {
                                seen_attestation = true;
                            } else {
                                state.lock().unwrap().forwarded_requests += 1;
                            }
                        }
                        if server.write_all(chunk).await.is_err() { return; }
                    }
                    read = async { let mut back = vec![0u8; 64 * 1024]; server.read(&mut back).await.map(|n| (n, back)) } => {
                        let Ok((n, back)) = read else { return };
                        if n == 0 { return; }
                        if tls.write_all(&back[..n]).await.is_err() { return; }
                    }
                }
            }
        }
    }
}

/// Reads one HTTP/1.1 request: its head (as sent) and its body (Content-Length).
async fn read_request_head<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
) -> Option<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut byte = [0u8; 1];
    while !data.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        data.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&data).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((head, body))
}

/// Reads one HTTP/1.1 request and returns its body (Content-Length).
async fn read_request<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<Vec<u8>> {
    read_whole_request(stream).await.map(|(_, body)| body)
}

/// Reads one HTTP/1.1 request: its request line and its body (Content-Length).
async fn read_whole_request<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
) -> Option<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if data.len() >= end + 4 + length {
                let request_line = String::from_utf8_lossy(&data[..end])
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                return Some((request_line, data[end + 4..end + 4 + length].to_vec()));
            }
        }
    }
}

fn attestation_nonce(body: &[u8]) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_slice(body).expect("attestation request JSON");
    hex::decode(value["nonce"].as_str().expect("nonce")).expect("hex nonce")
}

/// A relay's own TLS identity: a fresh key whose self-signed certificate carries the server's
/// evidence extension, copied byte for byte.
struct Impostor {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
    upstream: Target,
}

impl Impostor {
    async fn new(served: &Served) -> Self {
        let (observed, _) = development_client()
            .exchange(&served.target(), &rand::random::<[u8; 32]>())
            .await
            .expect("exchange with the server");
        let (_, cert) = X509Certificate::from_der(&observed.certificate).expect("server cert");
        let extension = cert
            .extensions()
            .iter()
            .find(|e| e.oid.as_bytes() == EVIDENCE_EXTENSION_OID_DER)
            .expect("the server certificate carries evidence");
        let key = rcgen::KeyPair::generate().expect("key");
        let acceptor = tls_acceptor(evidence_certificate(&key, extension.value), &key);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls13")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth();
        Self {
            acceptor,
            connector: tokio_rustls::TlsConnector::from(Arc::new(client_config)),
            upstream: served.target(),
        }
    }

    async fn connect_upstream(
        &self,
        upstream: SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(upstream).await?;
        self.connector
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
    }

    /// The server's answer to `POST /v1/attestation` with `nonce`, over the relay's own
    /// connection.
    async fn fresh_answer(&self, nonce: &[u8]) -> String {
        let tcp = TcpStream::connect((self.upstream.host.as_str(), self.upstream.port))
            .await
            .expect("connect");
        let mut tls = self
            .connector
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
            .expect("tls");
        let body = serde_json::json!({ "nonce": hex::encode(nonce) }).to_string();
        let request = format!(
            "POST /v1/attestation HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.upstream.authority(),
            body.len()
        );
        tls.write_all(request.as_bytes()).await.expect("write");
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response).await;
        let end = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("response head");
        String::from_utf8(response[end + 4..].to_vec()).expect("utf8 body")
    }
}

/// A self-signed certificate for `key` carrying `content` as the evidence extension's value.
/// rcgen takes OID arcs as u64 and the evidence OID's last arc is larger: the certificate is made
/// under a placeholder OID of the same DER length (2.25 and eighteen arcs 1), whose bytes are
/// then replaced. That breaks the certificate's self-signature, which no client checks: trust
/// comes from the evidence, and the TLS handshake proves possession of the key.
fn evidence_certificate(key: &rcgen::KeyPair, content: &[u8]) -> Vec<u8> {
    let placeholder_arcs: Vec<u64> = [2, 25].into_iter().chain([1; 18]).collect();
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("params");
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            &placeholder_arcs,
            content.to_vec(),
        ));
    let own = params.self_signed(key).expect("certificate");
    let mut placeholder = vec![0x06, 0x13, 0x69];
    placeholder.extend([1u8; 18]);
    let mut real = vec![0x06, 0x13];
    real.extend_from_slice(EVIDENCE_EXTENSION_OID_DER);
    let mut der = own.der().to_vec();
    let at = der
        .windows(placeholder.len())
        .position(|w| w == placeholder.as_slice())
        .expect("placeholder OID");
    der[at..at + real.len()].copy_from_slice(&real);
    der
}

/// A TLS 1.3 server identity (rustls) for a DER certificate and its key.
fn tls_acceptor(certificate: Vec<u8>, key: &rcgen::KeyPair) -> tokio_rustls::TlsAcceptor {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .expect("tls13")
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(certificate)],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A certificate verifier that accepts anything (the relays are attackers).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
