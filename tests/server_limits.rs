//! The server's protection against slow, oversized and excess clients, TLS policy, and graceful
//! shutdown, driven over raw TLS connections where reqwest would hide the behaviour.

mod server_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use inferno::config::Config;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use server_support::{Harness, base_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

fn connector(
    cert_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(cert_pem.as_bytes()) {
        roots.add(cert.expect("certificate PEM")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

async fn tls(server: &Harness) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(server.addr).await?;
    connector(&server.cert_pem, &[&rustls::version::TLS13])
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_until_closed<S: AsyncReadExt + Unpin>(stream: &mut S, limit: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server kept the connection open past {limit:?}"
    );
    out
}

fn quick_timeouts() -> Config {
    let mut config = base_config();
    config.auth.keys.clear();
    config.limits.header_read_timeout_secs = 1;
    config.limits.body_read_timeout_secs = 1;
    config
}

#[tokio::test]
async fn tls12_is_refused() {
    let server = Harness::start(base_config(), false);
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let result = connector(&server.cert_pem, &[&rustls::version::TLS12])
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await;
    assert!(result.is_err(), "a TLS 1.2-only client must be refused");
    assert!(tls(&server).await.is_ok(), "TLS 1.3 is accepted");
}

#[tokio::test]
async fn silent_tcp_connections_are_closed_after_the_header_timeout() {
    let server = Harness::start(quick_timeouts(), false);
    let started = Instant::now();
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    read_until_closed(&mut tcp, Duration::from_secs(5)).await;
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn slow_headers_are_cut_off() {
    let server = Harness::start(quick_timeouts(), false);
    let mut stream = tls(&server).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let response = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(started.elapsed() >= Duration::from_millis(900));
    let text = String::from_utf8_lossy(&response);
    assert!(
        !text.contains("200 OK"),
        "an unfinished request was served: {text}"
    );
}

#[tokio::test]
async fn slow_bodies_get_408() {
    let server = Harness::start(quick_timeouts(), true);
    let mut stream = tls(&server).await.unwrap();
    stream
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":",
        )
        .await
        .unwrap();
    let response = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"error\""), "{text}");
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_for_a_free_slot() {
    let mut config = base_config();
    config.limits.max_connections = 1;
    let server = Harness::start(config, false);
    let mut first = tls(&server).await.expect("first connection");
    first
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = first.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 503"));

    let second = tokio::spawn({
        let cert = server.cert_pem.clone();
        let addr = server.addr;
        async move {
            let tcp = TcpStream::connect(addr).await?;
            connector(&cert, &[&rustls::version::TLS13])
                .connect(ServerName::try_from("localhost").expect("name"), tcp)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !second.is_finished(),
        "the second handshake completed while the slot was taken"
    );
    drop(first);
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second connection is served once the first closes");
    assert!(second.unwrap().is_ok());
}

#[tokio::test]
async fn shutdown_finishes_in_flight_streams_and_stops_accepting() {
    let mut config = base_config();
    config.server.shutdown_grace_secs = 30;
    let mut server = Harness::start(config, true);
    let mut response = server
        .post(
            "/v1/completions",
            server_support::ALICE,
            &serde_json::json!({"model": inferno::model::EMBEDDED_MODEL_NAME, "prompt": "Once",
                                "max_tokens": 300, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let first = response.chunk().await.unwrap().expect("first event");
    let shutdown = tokio::spawn(server.take_server().shutdown());
    let mut body = first.to_vec();
    while let Some(chunk) = response.chunk().await.expect("the stream finishes cleanly") {
        body.extend_from_slice(&chunk);
    }
    assert!(
        body.ends_with(b"data: [DONE]\n\n"),
        "the in-flight stream completed"
    );
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown completes once the stream is done")
        .unwrap();
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn shutdown_cuts_off_requests_after_the_grace_period() {
    let mut config = base_config();
    config.server.shutdown_grace_secs = 1;
    let mut server = Harness::start(config, true);
    // A client that never reads its stream keeps the request in flight indefinitely.
    let stalled = server
        .post(
            "/v1/completions",
            server_support::ALICE,
            &serde_json::json!({"model": inferno::model::EMBEDDED_MODEL_NAME, "prompt": "Once",
                                "max_tokens": 1900, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), server.take_server().shutdown())
        .await
        .expect("shutdown returns after the grace period");
    assert!(started.elapsed() >= Duration::from_millis(900));
    drop(stalled);
}

#[tokio::test]
async fn the_scrape_key_reads_the_per_principal_series() {
    let mut config = base_config();
    config.metrics.key_sha256 = Some(server_support::key_entry("scrape", "scrape-key").sha256);
    let server = Harness::start(config, true);
    let answered = server
        .post(
            "/v1/completions",
            server_support::ALICE,
            &serde_json::json!({"model": inferno::model::EMBEDDED_MODEL_NAME, "prompt": "x",
                                "max_tokens": 1}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), reqwest::StatusCode::OK);
    let scrape = |key: Option<&'static str>| {
        let mut request = server
            .client()
            .get(server.url("/metrics"))
            .header("accept", "application/openmetrics-text; version=1.0.0");
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send()
    };
    let full = scrape(Some("scrape-key")).await.unwrap();
    assert_eq!(full.status(), reqwest::StatusCode::OK);
    assert_eq!(
        full.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = full.text().await.unwrap();
    assert!(text.contains("principal=\"alice\""), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    // In the development profile an API key still reads the rest.
    let partial = scrape(Some(server_support::ALICE)).await.unwrap();
    assert_eq!(partial.status(), reqwest::StatusCode::OK);
    assert!(!partial.text().await.unwrap().contains("principal="));
    let refused = scrape(None).await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn public_metrics_need_no_key() {
    let mut config = base_config();
    config.metrics.public = true;
    let server = Harness::start(config, false);
    let response = server
        .client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let models = server
        .client()
        .get(server.url("/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        models.status(),
        reqwest::StatusCode::UNAUTHORIZED,
        "only /metrics is public"
    );
}
