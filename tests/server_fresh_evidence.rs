//! `POST /v1/attestation` and the start-up order, from the server's side (issue 9): nonce bounds,
//! replay, the rate limit, and no evidence, health or audit before start-up attestation. The
//! channel binding itself (nonce ‖ this connection's exporter, relays, other connections) is
//! checked from the client's side in `tests/client_trust.rs`.

mod server_support;

use inferno::server::Server;
use reqwest::StatusCode;
use serde_json::{Value, json};
use server_support::{Harness, base_config, runtime};

/// A started, attested server whose fresh-evidence limit allows `burst` challenges at once.
fn start(burst: u32) -> Harness {
    let mut config = base_config();
    config.attestation.fresh_evidence_burst = burst;
    config.attestation.fresh_evidence_per_minute = 1;
    Harness::start(config, true)
}

async fn challenge(harness: &Harness, nonce: &str) -> reqwest::Response {
    harness
        .client()
        .post(harness.url("/v1/attestation"))
        .json(&json!({ "nonce": nonce }))
        .send()
        .await
        .expect("challenge request")
}

async fn error_param(response: reqwest::Response) -> Option<String> {
    let body: Value = response.json().await.expect("OpenAI error JSON");
    body["error"]["param"].as_str().map(str::to_owned)
}

#[test]
fn fresh_evidence_binds_a_new_challenge_and_refuses_bad_or_replayed_nonces() {
    let harness = start(16);
    runtime().block_on(async {
        let nonce = hex::encode([0x5a; 32]);
        let response = challenge(&harness, &nonce).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.expect("JSON");
        assert!(body["evidence"].is_object(), "{body}");
        assert!(body["appraisal"].is_object(), "{body}");

        let replay = challenge(&harness, &nonce).await;
        assert_eq!(replay.status(), StatusCode::BAD_REQUEST, "a replayed nonce");

        for bad in [
            hex::encode([1u8; 15]),
            hex::encode([1u8; 65]),
            "zz".repeat(32),
        ] {
            let response = challenge(&harness, &bad).await;
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "nonce {bad}");
            assert_eq!(error_param(response).await.as_deref(), Some("nonce"));
        }
        let extra = harness
            .client()
            .post(harness.url("/v1/attestation"))
            .json(&json!({ "nonce": hex::encode([2u8; 32]), "model": "x" }))
            .send()
            .await
            .expect("request");
        assert_eq!(
            extra.status(),
            StatusCode::BAD_REQUEST,
            "unknown members are refused"
        );
    });
}

#[test]
fn fresh_evidence_is_rate_limited_with_retry_after() {
    let harness = start(2);
    runtime().block_on(async {
        // One client, one HTTP/2 connection: the budget is per connection (or per API key).
        let client = harness.client();
        for i in 0..2u8 {
            assert_eq!(
                challenge_on(&client, &harness, None, i + 10).await,
                StatusCode::OK,
                "challenge {i} of the burst"
            );
        }
        let limited = client
            .post(harness.url("/v1/attestation"))
            .json(&json!({ "nonce": hex::encode([99u8; 32]) }))
            .send()
            .await
            .expect("challenge request");
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(limited.headers().contains_key("retry-after"));
    });
}

async fn challenge_on(
    client: &reqwest::Client,
    harness: &Harness,
    key: Option<&str>,
    nonce: u8,
) -> StatusCode {
    let mut request = client
        .post(harness.url("/v1/attestation"))
        .json(&json!({ "nonce": hex::encode([nonce; 32]) }));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("challenge request");
    let status = response.status();
    // Read to the end, so that the connection goes back to the client's pool.
    let _ = response.bytes().await;
    status
}

/// Issue 47, defect 1: the budget is per client (TLS connection, or API key when one is sent),
/// so one client flooding challenges leaves everyone else's budget whole.
#[test]
fn one_client_spending_its_challenge_budget_leaves_the_others_theirs() {
    let harness = start(2);
    runtime().block_on(async {
        // One connection spends its burst.
        // HTTP/2 (by ALPN): every request shares the one connection, with no race between a
        // response's end and the next request's checkout of a pooled HTTP/1.1 connection.
        let flooder = harness.client();
        for nonce in 0..2 {
            assert_eq!(
                challenge_on(&flooder, &harness, None, nonce).await,
                StatusCode::OK
            );
        }
        assert_eq!(
            challenge_on(&flooder, &harness, None, 2).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        // Other connections still get fresh evidence.
        for nonce in 10..13 {
            let other = harness.client();
            assert_eq!(
                challenge_on(&other, &harness, None, nonce).await,
                StatusCode::OK
            );
        }
        // A key's budget follows the key across connections; another key keeps its own.
        for nonce in 20..22 {
            assert_eq!(
                challenge_on(
                    &harness.client(),
                    &harness,
                    Some(server_support::ALICE),
                    nonce
                )
                .await,
                StatusCode::OK
            );
        }
        assert_eq!(
            challenge_on(&harness.client(), &harness, Some(server_support::ALICE), 22).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            challenge_on(&harness.client(), &harness, Some(server_support::BOB), 23).await,
            StatusCode::OK
        );
    });
}

/// Issue 47, minor: only the documented JSON object is a challenge (not an array holding the
/// nonce, nor a `text/plain` body).
#[test]
fn a_challenge_is_only_the_documented_json_object() {
    let harness = start(16);
    runtime().block_on(async {
        let nonce = hex::encode([0x77; 32]);
        let array = harness
            .client()
            .post(harness.url("/v1/attestation"))
            .json(&json!([nonce]))
            .send()
            .await
            .expect("request");
        assert_eq!(array.status(), StatusCode::BAD_REQUEST);
        let plain = harness
            .client()
            .post(harness.url("/v1/attestation"))
            .header("content-type", "text/plain")
            .body(json!({ "nonce": nonce }).to_string())
            .send()
            .await
            .expect("request");
        assert_eq!(plain.status(), StatusCode::BAD_REQUEST);
        // The refusals did not use the nonce.
        assert_eq!(challenge(&harness, &nonce).await.status(), StatusCode::OK);
    });
}

#[test]
fn before_start_up_attestation_nothing_is_served() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut config = base_config();
    config.audit = Some(inferno_audit::AuditConfig {
        dir: tmp.path().join("audit"),
        ..Default::default()
    });
    let server: Server = std::thread::spawn(move || {
        runtime()
            .block_on(Server::start(config))
            .expect("server starts")
    })
    .join()
    .expect("start-up thread");
    let addr = server.local_addr();
    // Before start-up attestation the certificate carries no evidence: nothing to pin yet.
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .danger_accept_invalid_certs(true)
        .resolve("localhost", addr)
        .build()
        .expect("client");
    let url = |path: &str| format!("https://localhost:{}{path}", addr.port());
    runtime().block_on(async {
        let health = client.get(url("/health")).send().await.expect("health");
        assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = health.json().await.expect("JSON");
        assert_eq!(body, json!({"status": "loading", "audit": "pending"}));
        let document = client
            .get(url("/v1/attestation"))
            .send()
            .await
            .expect("GET");
        assert_eq!(document.status(), StatusCode::SERVICE_UNAVAILABLE);
        let fresh = client
            .post(url("/v1/attestation"))
            .json(&json!({ "nonce": hex::encode([3u8; 32]) }))
            .send()
            .await
            .expect("POST");
        assert_eq!(fresh.status(), StatusCode::SERVICE_UNAVAILABLE);
        server.shutdown().await;
    });
}
