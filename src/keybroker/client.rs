//! The appliance side of the key-release exchange: ask a key broker for a sealed model's key
//! with fresh evidence binding the broker's nonce and an ephemeral X25519 key, and open the
//! HPKE-sealed answer. A broker that cannot be reached (or answers 5xx) is retried a bounded
//! number of times; a refusal (4xx) is final.

use std::time::Duration;

use inferno_attestation::evidence::Evidence;
use inferno_attestation::runtime_data::{RuntimeData, challenge_binding};

use super::protocol::{
    ATTEST_PATH, AUTH_PATH, AttestRequest, AuthRequest, AuthResponse, ErrorBody, NONCE_LEN,
    PROTOCOL_VERSION, RELEASE_INFO, ReleaseResponse,
};
use crate::seal::ModelKey;
use crate::seal::manifest::WrappedKey;
use crate::seal::recipient::{self, RecipientKey, RecipientSecret};

/// How long one HTTP request to the broker may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The wait before the first retry; doubled for each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Why no key was released.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The broker could not be reached or failed, on every attempt.
    #[error("key broker {url} unavailable after {attempts} attempts: {last}")]
    Unavailable {
        /// The broker's URL.
        url: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The broker refused (final).
    #[error("key broker {url} refused: {message}")]
    Refused {
        /// The broker's URL.
        url: String,
        /// The broker's one-line reason.
        message: String,
    },
    /// The appliance could not produce evidence, or the answer is unusable (final).
    #[error("key release: {0}")]
    Local(String),
}

/// What the appliance asks for: the model and its wrapped key (from the sealed manifest).
#[derive(Debug, Clone)]
pub struct KeyRequest {
    /// The model id (`release.model_id`).
    pub model_id: String,
    /// The key id (`key_id`).
    pub key_id: String,
    /// The model key wrapped to the broker (`wrapped_key`).
    pub wrapped_key: WrappedKey,
    /// The TEE platform (`sev-snp` or `tdx`).
    pub tee: String,
}

/// One attempt failed: retry (transport or 5xx) or not.
enum Failure {
    Transient(String),
    Final(BrokerError),
}

/// Asks `url` for the key of `request`. `evidence_for` produces evidence over a runtime-data
/// document (the caller's start-up document with the challenge and the ephemeral key added);
/// it runs on a blocking thread. Up to `1 + retries` attempts, each with a new challenge.
pub async fn request_key<F>(
    url: &str,
    request: &KeyRequest,
    base_runtime_data: &RuntimeData,
    retries: u32,
    evidence_for: F,
) -> Result<ModelKey, BrokerError>
where
    F: Fn(RuntimeData) -> Result<Evidence, String> + Clone + Send + 'static,
{
    let url = url.trim_end_matches('/').to_owned();
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| BrokerError::Local(format!("HTTP client: {e}")))?;
    let attempts = retries.saturating_add(1);
    let mut backoff = FIRST_BACKOFF;
    let mut last = String::new();
    for attempt in 1..=attempts {
        match attempt_once(
            &client,
            &url,
            request,
            base_runtime_data,
            evidence_for.clone(),
        )
        .await
        {
            Ok(key) => return Ok(key),
            Err(Failure::Final(err)) => return Err(err),
            Err(Failure::Transient(why)) => {
                tracing::warn!(attempt, attempts, error = %why, "key broker unavailable");
                last = why;
                if attempt < attempts {
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                }
            }
        }
    }
    Err(BrokerError::Unavailable {
        url,
        attempts,
        last,
    })
}

async fn post<T: serde::Serialize, R: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    url: &str,
    path: &str,
    body: &T,
) -> Result<R, Failure> {
    let response = client
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .map_err(|e| Failure::Transient(format!("{path}: {}", error_chain(&e))))?;
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| Failure::Transient(format!("{path}: reading the answer: {e}")))?;
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|e| {
            Failure::Final(BrokerError::Local(format!(
                "{path}: the broker's answer is malformed: {e}"
            )))
        });
    }
    let message = serde_json::from_slice::<ErrorBody>(&bytes)
        .map(|b| b.error.message)
        .unwrap_or_else(|_| format!("HTTP {status}"));
    if status.is_server_error() {
        Err(Failure::Transient(format!(
            "{path}: HTTP {status}: {message}"
        )))
    } else {
        Err(Failure::Final(BrokerError::Refused {
            url: url.to_owned(),
            message: one_line(&message),
        }))
    }
}

async fn attempt_once<F>(
    client: &reqwest::Client,
    url: &str,
    request: &KeyRequest,
    base_runtime_data: &RuntimeData,
    evidence_for: F,
) -> Result<ModelKey, Failure>
where
    F: Fn(RuntimeData) -> Result<Evidence, String> + Send + 'static,
{
    let local = |m: String| Failure::Final(BrokerError::Local(m));
    let challenge: AuthResponse = post(
        client,
        url,
        AUTH_PATH,
        &AuthRequest {
            version: PROTOCOL_VERSION.to_owned(),
            tee: request.tee.clone(),
            model_id: request.model_id.clone(),
            key_id: request.key_id.clone(),
        },
    )
    .await?;
    let nonce = hex::decode(&challenge.nonce)
        .ok()
        .filter(|n| n.len() == NONCE_LEN)
        .ok_or_else(|| local("the broker's nonce is not 32 bytes of hex".into()))?;
    // A fresh key pair for this release only: its secret never leaves this function.
    let (secret, public) = RecipientSecret::generate();
    let runtime_data = release_runtime_data(base_runtime_data, &nonce, &public)
        .map_err(|e| local(format!("runtime data: {e}")))?;
    let evidence = tokio::task::spawn_blocking(move || evidence_for(runtime_data))
        .await
        .map_err(|e| local(format!("the evidence task failed: {e}")))?
        .map_err(|e| local(format!("collecting evidence: {e}")))?;
    let evidence = serde_json::to_value(&evidence).map_err(|e| local(e.to_string()))?;
    let released: ReleaseResponse = post(
        client,
        url,
        ATTEST_PATH,
        &AttestRequest {
            session: challenge.session,
            tee_pubkey: public.to_hex(),
            evidence,
            wrapped_key: request.wrapped_key.clone(),
        },
    )
    .await?;
    if released.key_id != request.key_id {
        return Err(local(format!(
            "the broker released key {} instead of {}",
            released.key_id, request.key_id
        )));
    }
    recipient::unwrap_with_info(&released.key, &secret, &request.key_id, RELEASE_INFO)
        .map_err(|e| local(format!("the released key does not open: {e}")))
}

/// The runtime data of a key-release evidence: `base` (the start-up document) with the
/// challenge binding of `nonce` (no TLS exporter) and the ephemeral key `public`.
pub fn release_runtime_data(
    base: &RuntimeData,
    nonce: &[u8],
    public: &RecipientKey,
) -> Result<RuntimeData, String> {
    let mut doc = base.clone();
    doc.key_release_x25519 = Some(public.to_hex());
    doc.set_challenge_bindings([challenge_binding(nonce, &[])])
        .map_err(|e| e.to_string())?;
    doc.validate().map_err(|e| e.to_string())?;
    Ok(doc)
}

/// An error and its sources on one line (reqwest hides the cause, e.g. "connection refused").
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    one_line(&text)
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
