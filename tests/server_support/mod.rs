//! The server harness shared by the `server_*` integration tests: a real server on
//! 127.0.0.1:0 with the embedded model on the CPU backend, and a reqwest client that trusts its
//! generated certificate.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use inferno::backend::{self, Device};
use inferno::config::{ApiKeyEntry, AttestationConfig, Config};
use inferno::engine::{Engine, ModelInfo};
use inferno::model::Model;
use inferno::server::{App, ModelService, Server};
use reqwest::StatusCode;
use serde_json::Value;

/// Alice's API key in [`base_config`].
pub const ALICE: &str = "alice-test-key";
/// Bob's API key in [`base_config`].
pub const BOB: &str = "bob-test-key";

pub fn key_entry(name: &str, key: &str) -> ApiKeyEntry {
    let hash = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    ApiKeyEntry {
        name: name.to_owned(),
        sha256: hex::encode(hash.as_ref()),
    }
}

/// The runtime the servers live on, independent of each test's runtime.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime")
    })
}

/// A started server and what a client needs to reach it.
pub struct Harness {
    /// The bound address.
    pub addr: SocketAddr,
    /// The server certificate in PEM (the one carrying the start-up evidence).
    pub cert_pem: String,
    /// Shared server state (engine stats, metrics).
    pub app: Arc<App>,
    server: Option<Server>,
}

impl Harness {
    /// Starts a server on the shared runtime, from a plain thread so that async tests may call
    /// it.
    pub fn start(config: Config, load_model: bool) -> Harness {
        std::thread::spawn(move || {
            let model = Model::embedded().expect("embedded model loads");
            Self::start_blocking(config, model, load_model)
        })
        .join()
        .expect("server start-up thread")
    }

    /// [`Harness::start`] serving the model in `dir` (loaded).
    pub fn start_model(config: Config, dir: &std::path::Path) -> Harness {
        Self::start_serving(config, Model::load(dir).expect("the model loads"))
    }

    /// Starts a server serving `model` (instead of the embedded one) on the CPU backend.
    pub fn start_serving(config: Config, model: Model) -> Harness {
        std::thread::spawn(move || Self::start_blocking(config, model, true))
            .join()
            .expect("server start-up thread")
    }

    fn start_blocking(config: Config, model: Model, load_model: bool) -> Harness {
        let engine_config = config.engine.clone();
        let server = runtime()
            .block_on(Server::start(config))
            .expect("server starts");
        runtime()
            .block_on(server.attest(model.digest.bytes))
            .expect("start-up attestation");
        if load_model {
            let backend =
                backend::select(Device::Cpu, &model, &engine_config).expect("CPU backend");
            let engine = Engine::spawn(backend, ModelInfo::of(&model), engine_config)
                .expect("engine starts");
            server.set_model(ModelService::new(model, engine, None));
        }
        Harness {
            addr: server.local_addr(),
            cert_pem: server.identity().cert_pem(),
            app: Arc::clone(server.app()),
            server: Some(server),
        }
    }

    /// Takes the server out, to shut it down.
    pub fn take_server(&mut self) -> Server {
        self.server.take().expect("server not taken yet")
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }

    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        let cert = reqwest::Certificate::from_pem(self.cert_pem.as_bytes()).expect("cert PEM");
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(cert)
            .resolve("localhost", self.addr)
            .timeout(Duration::from_secs(120))
    }

    pub fn client(&self) -> reqwest::Client {
        self.client_builder().build().expect("client")
    }

    /// A raw TLS connection to the server that trusts its certificate, offering `alpn` (none:
    /// no ALPN), for tests that speak HTTP/1.1 or HTTP/2 by hand.
    pub async fn tls_connect(
        &self,
        alpn: Option<&[u8]>,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.cert_pem.as_bytes()) {
            roots.add(cert.expect("certificate PEM")).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.into_iter().map(<[u8]>::to_vec).collect();
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
            .expect("TLS handshake")
    }

    pub fn post(&self, path: &str, key: &str, body: &Value) -> reqwest::RequestBuilder {
        self.client()
            .post(self.url(path))
            .bearer_auth(key)
            .json(body)
    }
}

pub fn base_config() -> Config {
    let mut config = Config {
        attestation: AttestationConfig::development(),
        ..Config::default()
    };
    config.server.listen = "127.0.0.1:0".parse().expect("address");
    config.auth.keys = vec![key_entry("alice", ALICE), key_entry("bob", BOB)];
    config.limits.max_body_bytes = 256 << 10;
    config.engine.kv_cache_bytes = 64 << 20;
    config
}

/// The shared server most tests use.
pub async fn json_of(response: reqwest::Response) -> Value {
    let text = response.text().await.expect("body");
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("not JSON ({err}): {text}"))
}

/// Asserts an OpenAI error body with `status`, returning the error object.
pub async fn expect_error(response: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    let body = json_of(response).await;
    let error = body["error"].clone();
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(
        error.get("param").is_some() && error.get("code").is_some(),
        "{body}"
    );
    error
}
