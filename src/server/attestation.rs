//! `/v1/attestation`, unauthenticated like `/health` so that a client verifies the server before
//! it sends anything secret (`docs/attestation-protocol.md`):
//!
//! - `GET`: the start-up evidence envelope, its runtime-data document and the appraisal that
//!   admitted it (the certificate's evidence extension holds the same envelope).
//! - `POST {"nonce": HEX}`: fresh evidence whose runtime data binds SHA-256(nonce ‖ exporter),
//!   the exporter being this TLS connection's (label `EXPORTER-inferno-attestation-v1`), with the
//!   server's own appraisal. Nonces are 16 to 64 bytes and used once; each client (API key, else TLS
//!   connection) is rate limited on its own;
//!   concurrent callers share one hardware request.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use http::{HeaderValue, Request, Response, header};
use http_body_util::BodyExt;
use inferno_attestation::runtime_data::{
    MAX_CHALLENGE_NONCE, MIN_CHALLENGE_NONCE, TLS_EXPORTER_LEN, challenge_binding,
    ohttp_challenge_binding,
};
use sha2::{Digest, Sha256};

use super::app::App;
use super::body::{Body, RequestBody, full};
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

/// `POST /v1/attestation`: fresh evidence bound to the caller's nonce and its channel: the TLS
/// connection's exporter, or, for a request sealed in Oblivious HTTP, the gateway key it was
/// sealed to.
pub async fn fresh(app: &App, request: Request<RequestBody>) -> Result<Response<Body>, ApiError> {
    let sealed = request.extensions().get::<super::ohttp::Sealed>().cloned();
    let exporter = request.extensions().get::<ConnectionExporter>().copied();
    let channel = match (sealed, exporter) {
        (Some(sealed), _) => Channel::Sealed(sealed),
        (None, Some(exporter)) => Channel::Tls(exporter),
        (None, None) => {
            return Err(ApiError::invalid_request(
                "fresh evidence is bound to the TLS connection's exporter value; this connection has no TLS",
            ));
        }
    };
    let attestation = app
        .attestation()
        .cloned()
        .ok_or_else(|| ApiError::unavailable("the server has not attested yet"))?;
    let principal = app.challenge_principal(request.headers());
    let client = match &channel {
        Channel::Sealed(sealed) => ChallengeClient::sealed(principal.as_deref(), sealed.client),
        Channel::Tls(exporter) => ChallengeClient::of(principal.as_deref(), exporter),
    };
    let nonce = read_nonce(request).await?;
    app.challenges().admit(&client, &nonce)?;
    let binding = match &channel {
        Channel::Sealed(sealed) => {
            ohttp_challenge_binding(&nonce, sealed.key_id, &sealed.public_key)
        }
        Channel::Tls(exporter) => challenge_binding(&nonce, &exporter.0),
    };
    let fresh = attestation.fresh(binding).await.map_err(|err| {
        tracing::error!(error = %err, "attestation: fresh evidence failed");
        ApiError::unavailable("fresh evidence could not be produced")
    })?;
    Ok(json(fresh.to_json()))
}

/// What a challenge is bound to besides its nonce.
enum Channel {
    /// The TLS connection it arrived on.
    Tls(ConnectionExporter),
    /// The Oblivious HTTP gateway key it was sealed to.
    Sealed(super::ohttp::Sealed),
}

async fn read_nonce(request: Request<RequestBody>) -> Result<Vec<u8>, ApiError> {
    let json_body = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return Err(ApiError::invalid_request(
            "the challenge body must be sent as `Content-Type: application/json`",
        ));
    }
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
    let not_object = |detail: String| {
        ApiError::invalid_request(format!(
            "the challenge body must be the JSON object {{\"nonce\": HEX}} and nothing else{detail}"
        ))
    };
    // Only the documented object: serde would also take a struct from a JSON array.
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|err| not_object(format!(": {err}")))?;
    if !value.is_object() {
        return Err(not_object(String::new()));
    }
    let body: ChallengeBody =
        serde_json::from_value(value).map_err(|err| not_object(format!(": {err}")))?;
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

/// Whose budget a challenge is charged to: the API key's holder when a valid key is sent (so a
/// key holder gains nothing by reconnecting), otherwise the TLS connection it arrived on
/// (identified by the SHA-256 of its exporter value, unique per connection).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ChallengeClient {
    /// A caller that presented a valid API key: the key's name.
    Principal(String),
    /// A caller without a valid key: its TLS connection.
    Connection([u8; 32]),
}

impl ChallengeClient {
    /// The client of a request on the connection with `exporter`, authenticated as `principal`
    /// when it sent a valid key.
    pub fn of(principal: Option<&str>, exporter: &ConnectionExporter) -> Self {
        match principal {
            Some(name) => Self::Principal(name.to_owned()),
            None => Self::Connection(Sha256::digest(exporter.0).into()),
        }
    }

    /// The client of a request sealed in Oblivious HTTP: the principal when it sent a valid
    /// key inside, else the outer connection the gateway received it on (`connection`: that
    /// connection's id, see [`super::ohttp::Sealed::client`]).
    pub fn sealed(principal: Option<&str>, connection: [u8; 32]) -> Self {
        match principal {
            Some(name) => Self::Principal(name.to_owned()),
            None => Self::Connection(connection),
        }
    }
}

/// How many clients' buckets are remembered at most. Beyond it, full buckets (those of idle
/// clients, which a fresh bucket equals) are forgotten first, then the longest-idle ones.
const MAX_TRACKED_CLIENTS: usize = 1 << 14;

/// Admission of fresh-evidence challenges: each nonce once, and per client (see
/// [`ChallengeClient`]) a token bucket of `[attestation] fresh_evidence_burst` challenges refilled
/// at `fresh_evidence_per_minute`, so that one client spending its budget leaves everyone
/// else's intact (concurrent challenges share one hardware request, so the hardware's load does
/// not grow with the number of clients).
pub struct ChallengeGate {
    state: Mutex<GateState>,
    burst: f64,
    per_second: f64,
}

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

struct GateState {
    buckets: HashMap<ChallengeClient, Bucket>,
    seen: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl ChallengeGate {
    /// The gate for the configured limits.
    pub fn new(config: &AttestationConfig) -> Self {
        Self {
            state: Mutex::new(GateState {
                buckets: HashMap::new(),
                seen: HashSet::new(),
                order: VecDeque::new(),
            }),
            burst: f64::from(config.fresh_evidence_burst.max(1)),
            per_second: f64::from(config.fresh_evidence_per_minute) / 60.0,
        }
    }

    /// Admits `nonce` from `client`: 400 when the nonce was used before, 429 when this client's
    /// rate limit is reached.
    pub fn admit(&self, client: &ChallengeClient, nonce: &[u8]) -> Result<(), ApiError> {
        let key: [u8; 32] = Sha256::digest(nonce).into();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.seen.contains(&key) {
            return Err(ApiError::invalid_param(
                "nonce",
                "this nonce was already used; choose a fresh random nonce for every challenge",
            ));
        }
        let now = Instant::now();
        if !state.buckets.contains_key(client) && state.buckets.len() >= MAX_TRACKED_CLIENTS {
            self.forget_idle(&mut state.buckets, now);
        }
        let bucket = state.buckets.entry(client.clone()).or_insert(Bucket {
            tokens: self.burst,
            refilled: now,
        });
        let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(self.burst);
        bucket.refilled = now;
        if bucket.tokens < 1.0 {
            let wait = if self.per_second > 0.0 {
                ((1.0 - bucket.tokens) / self.per_second).ceil() as u64
            } else {
                60
            };
            return Err(ApiError::rate_limited(
                "too many attestation challenges from this client; retry later",
                wait.max(1),
            ));
        }
        bucket.tokens -= 1.0;
        if state.order.len() == REMEMBERED_NONCES
            && let Some(oldest) = state.order.pop_front()
        {
            state.seen.remove(&oldest);
        }
        state.seen.insert(key);
        state.order.push_back(key);
        Ok(())
    }

    /// Makes room for a new client: drops every bucket that has refilled (it equals a new one),
    /// and if none has, the one idle the longest.
    fn forget_idle(&self, buckets: &mut HashMap<ChallengeClient, Bucket>, now: Instant) {
        let full = |bucket: &Bucket| {
            bucket.tokens + now.duration_since(bucket.refilled).as_secs_f64() * self.per_second
                >= self.burst
        };
        buckets.retain(|_, bucket| !full(bucket));
        if buckets.len() >= MAX_TRACKED_CLIENTS
            && let Some(oldest) = buckets
                .iter()
                .min_by_key(|(_, bucket)| bucket.refilled)
                .map(|(client, _)| client.clone())
        {
            buckets.remove(&oldest);
        }
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

    fn connection(byte: u8) -> ChallengeClient {
        ChallengeClient::of(None, &ConnectionExporter([byte; TLS_EXPORTER_LEN]))
    }

    #[test]
    fn a_nonce_is_admitted_once() {
        let gate = gate(10, 60);
        gate.admit(&connection(1), &[1; 16]).unwrap();
        let err = gate.admit(&connection(1), &[1; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        // Used is used, whoever sends it next.
        let err = gate.admit(&connection(2), &[1; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        gate.admit(&connection(1), &[2; 16]).unwrap();
    }

    #[test]
    fn the_burst_is_limited_and_a_refused_nonce_stays_usable() {
        let gate = gate(2, 0);
        let client = connection(1);
        gate.admit(&client, &[1; 16]).unwrap();
        gate.admit(&client, &[2; 16]).unwrap();
        let err = gate.admit(&client, &[3; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
        // Refused for the rate, not used: the same nonce is refused for the rate again.
        let err = gate.admit(&client, &[3; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn one_client_spending_its_budget_leaves_the_others_theirs() {
        let gate = gate(2, 0);
        let flooder = connection(1);
        for nonce in 0..2u8 {
            gate.admit(&flooder, &[nonce; 16]).unwrap();
        }
        let err = gate.admit(&flooder, &[9; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
        gate.admit(&connection(2), &[10; 16]).unwrap();
        gate.admit(&connection(3), &[11; 16]).unwrap();
        // A key's budget follows the key, whatever connection it comes on.
        let alice = ChallengeClient::of(Some("alice"), &ConnectionExporter([4; 32]));
        gate.admit(&alice, &[12; 16]).unwrap();
        let again = ChallengeClient::of(Some("alice"), &ConnectionExporter([5; 32]));
        gate.admit(&again, &[13; 16]).unwrap();
        let err = gate.admit(&again, &[14; 16]).unwrap_err();
        assert_eq!(err.status, StatusCode::TOO_MANY_REQUESTS);
        gate.admit(
            &ChallengeClient::of(Some("bob"), &ConnectionExporter([5; 32])),
            &[15; 16],
        )
        .unwrap();
    }

    #[test]
    fn the_tracked_clients_are_bounded() {
        let gate = gate(1, 0);
        for n in 0..(MAX_TRACKED_CLIENTS as u32 + 10) {
            let mut exporter = [0u8; TLS_EXPORTER_LEN];
            exporter[..4].copy_from_slice(&n.to_le_bytes());
            let mut nonce = [0u8; 16];
            nonce[..4].copy_from_slice(&n.to_le_bytes());
            gate.admit(
                &ChallengeClient::of(None, &ConnectionExporter(exporter)),
                &nonce,
            )
            .unwrap();
        }
        let state = gate.state.lock().unwrap();
        assert!(state.buckets.len() <= MAX_TRACKED_CLIENTS);
    }
}
