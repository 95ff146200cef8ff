//! `inferno proxy` against the real server and against test upstreams on loopback (attested
//! but swapped, unattested, unreachable): it forwards only to a verified upstream, answers 502
//! otherwise, and recovers when the upstream does.

mod proxy_support;
mod spawn_support;
mod trust_support;

use proxy_support::{Proxy, development_policy};
use trust_support::{
    Impostor, Relay, RelayMode, Served, attestation_nonce, evidence_certificate, read_request_head,
    read_whole_request, runtime, tls_acceptor, verify_json,
};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;

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
