//! The real servers, relays and impostors of the client chain-of-trust tests
//! (`client_trust.rs`, `proxy_trust.rs`): `inferno serve` in the development profile, TCP and
//! TLS relays on loopback, and an impostor that replays evidence obtained elsewhere.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inferno_attestation::runtime_data::EVIDENCE_EXTENSION_OID_DER;
use inferno_client::policy::LoadedClientPolicy;
use inferno_client::{Client, Target};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use x509_parser::prelude::{FromDer as _, X509Certificate};

use super::proxy_support::development_policy;
use super::spawn_support;

pub fn inferno(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .output()
        .expect("runs inferno")
}

/// A running `inferno serve` (development profile); stopped on drop.
pub struct Served {
    pub child: Child,
    pub base: String,
    pub _work: tempfile::TempDir,
}

impl Served {
    pub fn start() -> Self {
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

    pub fn target(&self) -> Target {
        Target::parse(&self.base).expect("server address")
    }

    pub fn addr(&self) -> SocketAddr {
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

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

pub fn development_client() -> Client {
    Client::new(
        LoadedClientPolicy::from_file(&development_policy()).expect("client policy"),
        None,
    )
}

/// `inferno verify --json`: the exit code and the report.
pub fn verify_json(server: &str, policy: &Path) -> (i32, serde_json::Value) {
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

/// What a relay does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
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
pub struct Relay {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<RelayState>>,
    pub task: tokio::task::JoinHandle<()>,
}

pub struct RelayState {
    pub mode: RelayMode,
    pub generation: u64,
    pub forwarded_requests: usize,
    pub connections: usize,
}

impl Relay {
    pub async fn start(
        upstream: SocketAddr,
        mode: RelayMode,
        impostor: Option<Arc<Impostor>>,
    ) -> Self {
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

    pub fn base(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn switch(&self, mode: RelayMode) {
        let mut s = self.state.lock().unwrap();
        s.mode = mode;
        s.generation += 1;
        drop(s);
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Connections the relay accepted.
    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    /// Requests other than the attestation request that a terminating relay passed upstream.
    pub fn forwarded_requests(&self) -> usize {
        self.state.lock().unwrap().forwarded_requests
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn relay_connection(
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
pub async fn read_request_head<S: tokio::io::AsyncRead + Unpin>(
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
pub async fn read_request<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<Vec<u8>> {
    read_whole_request(stream).await.map(|(_, body)| body)
}

/// Reads one HTTP/1.1 request: its request line and its body (Content-Length).
pub async fn read_whole_request<S: tokio::io::AsyncRead + Unpin>(
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

pub fn attestation_nonce(body: &[u8]) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_slice(body).expect("attestation request JSON");
    hex::decode(value["nonce"].as_str().expect("nonce")).expect("hex nonce")
}

/// A relay's own TLS identity: a fresh key whose self-signed certificate carries the server's
/// evidence extension, copied byte for byte.
pub struct Impostor {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub connector: tokio_rustls::TlsConnector,
    pub upstream: Target,
}

impl Impostor {
    pub async fn new(served: &Served) -> Self {
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

    pub async fn connect_upstream(
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
    pub async fn fresh_answer(&self, nonce: &[u8]) -> String {
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
pub fn evidence_certificate(key: &rcgen::KeyPair, content: &[u8]) -> Vec<u8> {
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
pub fn tls_acceptor(certificate: Vec<u8>, key: &rcgen::KeyPair) -> tokio_rustls::TlsAcceptor {
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
pub struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

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
