//! Oblivious HTTP through a TLS-terminating relay (the test's own, which logs every plaintext
//! byte it forwards) in front of the real server (`inferno serve`, simulated TEE, embedded
//! model, CPU backend, audit log on): `inferno proxy --ohttp` serves a chat completion, a
//! streamed one and a tool call; the relay's log holds neither prompt nor answer; a flipped byte
//! gets a clean error; a replayed request is refused; a relay that serves its own key
//! configuration is rejected, naming the check; the receipts travel inside the sealed answer
//! and the audit record says `ohttp`.

mod proxy_support;
mod spawn_support;

use proxy_support::{Proxy, development_policy};

use std::io::Cursor;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;

const PROMPT: &str = "Tell me about the secret lighthouse of Varnholm";

/// A running `inferno serve` with an audit log; stopped on drop.
struct Served {
    child: Child,
    base: String,
    _work: tempfile::TempDir,
}

impl Served {
    fn start() -> Self {
        let work = tempfile::tempdir().expect("tempdir");
        let config = format!(
            "[server]\ntool_call_parser = \"hermes\"\n[attestation]\nprofile = \"development\"\n[audit]\ndir = {:?}\ncheckpoint_every_records = 1\ncheckpoint_every_seconds = 1\n",
            work.path().join("audit").to_str().expect("utf8")
        );
        let (child, base) = spawn_support::spawn_server(&config, work.path(), "warn");
        Self {
            child,
            base,
            _work: work,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the relay does with what it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forwards every request and answer unchanged.
    Pass,
    /// Flips one byte of every sealed request body.
    Flip,
    /// Serves its own key configuration and opens what is sealed to it, asking the real server
    /// for evidence over its own TLS connection.
    Impostor,
}

struct RelayState {
    mode: Mode,
    /// Every plaintext byte forwarded, both ways.
    log: Vec<u8>,
    /// The last sealed request body forwarded to `/v1/ohttp`.
    last_sealed: Option<(String, Vec<u8>)>,
}

/// A TLS-terminating HTTP relay in front of the server (its own self-signed certificate).
struct Relay {
    addr: SocketAddr,
    state: Arc<Mutex<RelayState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("addr");
        let certified =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("certificate");
        let key =
            rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let state = Arc::new(Mutex::new(RelayState {
            mode: Mode::Pass,
            log: Vec::new(),
            last_sealed: None,
        }));
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .expect("relay client");
        let impostor = Arc::new(ohttp_impostor_key());
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let state = Arc::clone(&shared);
                let http = http.clone();
                let upstream = upstream.clone();
                let impostor = Arc::clone(&impostor);
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        let state = Arc::clone(&state);
                        let http = http.clone();
                        let upstream = upstream.clone();
                        let impostor = Arc::clone(&impostor);
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                relay(request, &state, &http, &upstream, &impostor).await,
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    fn base(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn set(&self, mode: Mode) {
        self.state.lock().unwrap().mode = mode;
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&self.state.lock().unwrap().log).into_owned()
    }

    fn last_sealed(&self) -> (String, Vec<u8>) {
        self.state
            .lock()
            .unwrap()
            .last_sealed
            .clone()
            .expect("a sealed request went through")
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type RelayBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> RelayBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// Forwards one request upstream (or plays the impostor gateway), logging every byte.
async fn relay(
    request: hyper::Request<Incoming>,
    state: &Arc<Mutex<RelayState>>,
    http: &reqwest::Client,
    upstream: &str,
    impostor: &ohttp::Server,
) -> hyper::Response<RelayBody> {
    let (parts, body) = request.into_parts();
    let mut body = body
        .collect()
        .await
        .expect("request body")
        .to_bytes()
        .to_vec();
    let path = parts.uri.path().to_owned();
    let media = parts
        .headers
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mode = {
        let mut state = state.lock().unwrap();
        state.log.extend_from_slice(
            format!("{} {path}\n{:?}\n", parts.method, parts.headers).as_bytes(),
        );
        state.log.extend_from_slice(&body);
        if path == "/v1/ohttp" {
            state.last_sealed = Some((media.clone(), body.clone()));
        }
        state.mode
    };
    match (mode, path.as_str()) {
        (Mode::Flip, "/v1/ohttp") => {
            let last = body.len() - 1;
            body[last] ^= 0x01;
        }
        (Mode::Impostor, "/.well-known/ohttp-gateway") => {
            let list = ohttp::KeyConfig::encode_list(&[impostor.config()]).expect("list");
            return hyper::Response::builder()
                .header("content-type", "application/ohttp-keys")
                .body(full(list))
                .expect("response");
        }
        (Mode::Impostor, "/v1/ohttp") => {
            return impostor_answer(impostor, &body, http, upstream).await;
        }
        _ => {}
    }
    let mut forwarded = http
        .request(parts.method.clone(), format!("{upstream}{}", parts.uri))
        .body(body);
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            forwarded = forwarded.header(name, value);
        }
    }
    let answer = forwarded.send().await.expect("upstream answers");
    let mut response = hyper::Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if name != "content-length" && name != "transfer-encoding" && name != "connection" {
            response = response.header(name, value);
        }
    }
    let state = Arc::clone(state);
    let stream = answer.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        state.lock().unwrap().log.extend_from_slice(&chunk);
        Ok(Frame::data(chunk))
    });
    response
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response")
}

/// A gateway key of the impostor's own.
fn ohttp_impostor_key() -> ohttp::Server {
    use ohttp::hpke::{Aead, Kdf, Kem};
    let config = ohttp::KeyConfig::new(
        7,
        Kem::X25519Sha256,
        vec![ohttp::SymmetricSuite::new(Kdf::HkdfSha256, Aead::Aes128Gcm)],
    )
    .expect("impostor key");
    ohttp::Server::new(config).expect("impostor gateway")
}

/// Opens a request sealed to the impostor's key, passes the inner request to the real server
/// over the impostor's own TLS connection, and seals the answer back.
async fn impostor_answer(
    impostor: &ohttp::Server,
    body: &[u8],
    http: &reqwest::Client,
    upstream: &str,
) -> hyper::Response<RelayBody> {
    let (plain, responder) = impostor.decapsulate(body).expect("sealed to the impostor");
    let inner = bhttp::Message::read_bhttp(&mut Cursor::new(&plain[..])).expect("binary HTTP");
    let path = String::from_utf8(inner.control().path().expect("path").to_vec()).expect("utf8");
    let answer = http
        .post(format!("{upstream}{path}"))
        .header("content-type", "application/json")
        .body(inner.content().to_vec())
        .send()
        .await
        .expect("upstream answers");
    let status = answer.status().as_u16();
    let content = answer.bytes().await.expect("answer");
    let mut message =
        bhttp::Message::response(bhttp::StatusCode::try_from(u64::from(status)).expect("status"));
    message.put_header("content-type", "application/json");
    message.write_content(&content);
    let mut encoded = Vec::new();
    message
        .write_bhttp(bhttp::Mode::KnownLength, &mut encoded)
        .expect("encode");
    hyper::Response::builder()
        .header("content-type", "message/ohttp-res")
        .body(full(responder.encapsulate(&encoded).expect("seal")))
        .expect("response")
}

fn chat(stream: bool, extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 24,
        "temperature": 0.0,
        "stream": stream,
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": false
        }
    }})
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn sealed_requests_cross_a_tls_terminating_relay_that_sees_no_prompt_or_answer() {
    let served = Served::start();
    let rt = runtime();
    let relay = rt.block_on(Relay::start(served.base.clone()));
    let proxy = Proxy::start(&relay.base(), &["--ohttp"]);
    let http = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", proxy.base);
    rt.block_on(async {
        let model = http
            .get(format!("{}/v1/models", proxy.base))
            .send()
            .await
            .expect("models");
        assert_eq!(model.status(), 200);
        let model_id = model.json::<Value>().await.expect("json")["data"][0]["id"]
            .as_str()
            .expect("model id")
            .to_owned();
        let with_model = |mut body: Value| {
            body["model"] = json!(model_id);
            body
        };

        // A chat completion.
        let answer = http
            .post(&url)
            .json(&with_model(chat(false, json!({}))))
            .send()
            .await
            .expect("chat");
        assert_eq!(answer.status(), 200);
        assert!(answer.headers().contains_key("inferno-verified-measurement"));
        let index: u64 = answer.headers()["inferno-audit-index"]
            .to_str()
            .expect("receipt")
            .parse()
            .expect("index");
        let body: Value = answer.json().await.expect("json");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
            .to_owned();
        assert!(!content.trim().is_empty(), "{body}");

        // A streamed one: events arrive as server-sent events, ending with [DONE].
        let streamed = http
            .post(&url)
            .json(&with_model(chat(true, json!({}))))
            .send()
            .await
            .expect("streamed chat");
        assert_eq!(streamed.status(), 200);
        assert_eq!(streamed.headers()["content-type"], "text/event-stream");
        let mut events = streamed.bytes_stream();
        let mut text = String::new();
        let mut frames = 0;
        while let Some(chunk) = events.next().await {
            text.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf8"));
            frames += 1;
        }
        assert!(frames > 2, "events arrive chunk by chunk, not at once: {frames}");
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        let streamed_content: String = text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter_map(|event| {
                event["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(streamed_content, content, "greedy: the same answer");

        // A tool call.
        let tool = with_model(chat(
            false,
            json!({"tools": [weather_tool()], "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 60}),
        ));
        let called: Value = http
            .post(&url)
            .json(&tool)
            .send()
            .await
            .expect("tool call")
            .json()
            .await
            .expect("json");
        let calls = called["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("tool calls: {called}"));
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let arguments = calls[0]["function"]["arguments"].as_str().expect("arguments");

        // The relay forwarded all of it and saw none of it.
        let log = relay.log();
        assert!(log.contains("/v1/ohttp"), "the relay carried the sealed requests");
        for secret in [PROMPT, content.trim(), arguments, "get_weather", "chat/completions"] {
            // Very short answers could occur in the headers' text by chance.
            if secret.len() >= 8 {
                assert!(!log.contains(secret), "the relay saw {secret:?}");
            }
        }

        // The receipt travelled inside the sealed answer, and the record says ohttp.
        let mut record = None;
        for _ in 0..50 {
            let proof = http
                .get(format!("{}/v1/audit/proof?index={index}", proxy.base))
                .send()
                .await
                .expect("proof");
            if proof.status() == 200 {
                record = Some(proof.json::<Value>().await.expect("json"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let record = record.expect("a checkpoint covers the record");
        let payload = base64::engine::general_purpose::STANDARD
            .decode(record["record"].as_str().expect("the caller's own record"))
            .expect("base64");
        let payload = String::from_utf8_lossy(&payload);
        assert!(payload.contains("\"transport\":\"ohttp\""), "{payload}");
    });
}

#[test]
fn a_flipped_byte_a_replay_and_an_impostor_key_are_refused() {
    let served = Served::start();
    let rt = runtime();
    let relay = rt.block_on(Relay::start(served.base.clone()));
    let proxy = Proxy::start(&relay.base(), &["--ohttp"]);
    let http = reqwest::Client::new();
    rt.block_on(async {
        let models = format!("{}/v1/models", proxy.base);
        assert_eq!(
            http.get(&models).send().await.expect("models").status(),
            200
        );

        // Replayed as is, the sealed request is refused in plain text.
        let (media, sealed) = relay.last_sealed();
        let insecure = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .expect("client");
        let replayed = insecure
            .post(format!("{}/v1/ohttp", served.base))
            .header("content-type", media)
            .body(sealed)
            .send()
            .await
            .expect("replay");
        assert_eq!(replayed.status(), 400);
        let text = replayed.text().await.expect("body");
        assert!(text.contains("replay"), "{text}");

        // One flipped byte: a clean error, no answer, and recovery afterwards.
        relay.set(Mode::Flip);
        let flipped = http.get(&models).send().await.expect("flipped");
        assert_eq!(flipped.status(), 502);
        let error: Value = flipped.json().await.expect("OpenAI error JSON");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("could not be opened") || message.contains("HTTP 400"),
            "{message}"
        );
        relay.set(Mode::Pass);
        assert_eq!(
            http.get(&models).send().await.expect("models").status(),
            200
        );

        // A relay serving its own key configuration: rejected, naming the check.
        relay.set(Mode::Impostor);
        let impostor = Proxy::start(&relay.base(), &["--ohttp"]);
        let refused = http
            .get(format!("{}/v1/models", impostor.base))
            .send()
            .await
            .expect("impostor");
        assert_eq!(refused.status(), 502);
        let error: Value = refused.json().await.expect("OpenAI error JSON");
        assert_eq!(error["error"]["code"], "upstream_verification_failed");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(message.contains("ohttp.key_config"), "{message}");
        assert!(message.contains("ohttp.challenge"), "{message}");
    });
}

#[test]
fn verify_ohttp_trusts_the_server_and_names_the_checks() {
    let served = Served::start();
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["verify", "--ohttp", &served.base, "--json", "--policy"])
        .arg(development_policy())
        .output()
        .expect("runs inferno verify");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let checks: Vec<&str> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|check| check["id"].as_str().expect("id"))
        .collect();
    for check in ["evidence.appraisal", "ohttp.key_config", "ohttp.challenge"] {
        assert!(checks.contains(&check), "{checks:?}");
    }
    assert_eq!(report["verdict"], "pass");
}
