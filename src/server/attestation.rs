//! `/v1/attestation`, unauthenticated like `/health` so that a client verifies the server before
//! it sends anything secret (`docs/attestation-protocol.md`):
//!
//! - `GET`: the start-up evidence envelope, its runtime-data document and the appraisal that
//!   admitted it (the certificate's evidence extension holds the same envelope).
//! - `POST {"nonce": HEX}`: fresh evidence whose runtime data binds SHA-256(nonce ‖ exporter),
//!   the exporter being this TLS connection's (label `EXPORTER-inferno-attestation-v1`), with the
//!   server's own appraisal. Nonces are 16 to 64 bytes and used once; callers are rate limited;
//!   concurrent callers share one hardware request.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use http::{HeaderValue, Request, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use inferno_attestation::runtime_data::{
    MAX_CHALLENGE_NONCE, MIN_CHALLENGE_NONCE, TLS_EXPORTER_LEN, challenge_binding,
};
use sha2::{Digest, Sha256};

use super::app::App;
use super::body::{Body, full};
use super::error::ApiError;
use crate::config::AttestationConfig;

/// The TLS exporter value of the connection a request arrived on (request extension set by the
/// accept loop; absent on a connection without TLS).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionExporter(pub [u8; TLS_EXPORTER_LEN]);

/// Largest `POST /v1/attestation` body read (a 64-byte nonce in hex is 128 characters).
const MAX_CHALLENGE_BODY: usize = 1024;

/// How many used nonces are remembered (as SHA-256) to refuse their replay.
const REMEMBERED_NONCES: usize = 1 << 16;

/// The attestation document as JSON.
pub fn document(app: &App) -> Result<Response<Body>, ApiError> {
    let attestation = app
        .attestation()
        .ok_or_else(|| ApiError::unavailable("the server has not attested yet"))?;
    Ok(json(attestation.startup().to_json()))
}

/// `POST /v1/attestation`: fresh evidence bound to the caller's nonce and TLS connection.
pub async fn fresh(app: &App, request: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let exporter = request
        .extensions()
        .get::<ConnectionExporter>()
        .copied()
        .ok_or_else(|| {
            ApiError::invalid_request(
                "fresh evidence is bound to the TLS connection's exporter value; this connection has no TLS",
            )
        })?;
    let attestation = app
        .attestation()
        .cloned()
        .ok_or_else(|| ApiError::unavailable("the server has not attested yet"))?;
    let nonce = read_nonce(request).await?;
    app.challenges().admit(&nonce)?;
    let binding = challenge_binding(&nonce, &exporter.0);
    let fresh = attestation.fresh(binding).await.map_err(|err| {
        tracing::error!(error = %err, "attestation: fresh evidence failed");
        ApiError::unavailable("fresh evidence could not be produced")
    })?;
    Ok(json(fresh.to_json()))
}

async fn read_nonce(request: Request<Incoming>) -> Result<Vec<u8>, ApiError> {
    let limited = http_body_util::Limited::new(request.into_body(), MAX_CHALLENGE_BODY);
    let bytes = limited
        .collect()
        .await
        .map_err(|_| {
            ApiError::invalid_request(format!(
                "the challenge body must be JSON of at most {MAX_CHALLENGE_BODY} bytes"
            ))
        })?
        .to_bytes();
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ChallengeBody {
        nonce: String,
    }
    let body: ChallengeBody = serde_json::from_slice(&bytes).map_err(|err| {
        ApiError::invalid_request(format!(
            "the challenge body must be {{\"nonce\": HEX}} and nothing else: {err}"
        ))
    })?;
    let nonce = hex::decode(&body.nonce)
        .map_err(|err| ApiError::invalid_param("nonce", format!("nonce is not hex: {err}")))?;
    if !(MIN_CHALLENGE_NONCE..=MAX_CHALLENGE_NONCE).contains(&nonce.len()) {
        return Err(ApiError::invalid_param(
            "nonce",
            format!(
                "nonce is {} bytes; it must be {MIN_CHALLENGE_NONCE} to {MAX_CHALLENGE_NONCE} bytes",
                nonce.len()
            ),
        ));
    }
    Ok(nonce)
}

fn json(body: String) -> Response<Body> {
    let mut response = Response::new(full(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Admission of fresh-evidence challenges: each nonce once, and a token bucket of
/// `[attestation] fresh_evidence_burst` challenges refilled at `fresh_evidence_per_minute`.
pub struct ChallengeGate {
    state: Mutex<GateState>,
    burst: f64,
    per_second: f64,
}

struct GateState {
    tokens: f64,
    refilled: Instant,
    seen: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl ChallengeGate {
    /// The gate for the configured limits.
    pub fn new(config: &AttestationConfig) -> Self {
        let burst = f64::from(config.fresh_evidence_burst.max(1));
        Self {
            state: Mutex::new(GateState {
                tokens: burst,
                refilled: Instant::now(),
                seen: HashSet::new(),
                order: VecDeque::new(),
            }),
            burst,
            per_second: f64::from(config.fresh_evidence_per_minute) / 60.0,
        }
    }

    /// Admits `nonce`: 400 when it was used before, 429 when the rate limit is reached.
    fn admit(&self, nonce: &[u8]) -> Result<(), ApiError> {
        let key: [u8; 32] = Sha256::digest(nonce).into();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.seen.contains(&key) {
            return Err(ApiError::invalid_param(
                "nonce",
                "this nonce was already used; choose a fresh random nonce for every challenge",
            ));
        }
        let now = Instant::now();
        let elapsed = now.duration_since(state.refilled).as_secs_f64();
        state.tokens = (state.tokens + elapsed * self.per_second).min(self.burst);
        state.refilled = now;
        if state.tokens < 1.0 {
            let wait = if self.per_second > 0.0 {
                ((1.0 - state.tokens) / self.per_second).ceil() as u64
            } else {
                60
            };
            return Err(ApiError::rate_limited(
                "too many attestation challenges; retry later",
                wait.max(1),
            ));
        }
        state.tokens -= 1.0;
        if state.order.len() == REMEMBERED_NONCES
            && let Some(oldest) = state.order.pop_front()
        {
            state.seen.remove(&oldest);
        }
        state.seen.insert(key);
        state.order.push_back(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn gate(burst: u32, per_minute: u32) -> ChallengeGate {
        ChallengeGate::new(&AttestationConfig {
            fresh_evidence_burst: burst,
            fresh_evidence_per_minute: per_minute,
            ..AttestationConfig::development()
        })
    }

    #[test]
    fn a_nonce_is_admitted_once() {
        let gate = gate(10, 60);
        gate.admit(&[1; 16]).unwrap();
        let err = gate.admit(&[1; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        gate.admit(&[2; 16]).unwrap();
    }

    #[test]
    fn the_burst_is_limited_and_a_refused_nonce_stays_usable() {
        let gate = gate(2, 0);
        gate.admit(&[1; 16]).unwrap();
        gate.admit(&[2; 16]).unwrap();
        let err = gate.admit(&[3; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
        // Refused for the rate, not used: the same nonce is refused for the rate again.
        let err = gate.admit(&[3; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
    }
}
