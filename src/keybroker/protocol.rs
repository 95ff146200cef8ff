//! The key-release exchange between an appliance and `inferno keybroker`, modelled on the
//! Confidential Containers Trustee KBS protocol (request, challenge, attestation, response):
//!
//! 1. `POST /kbs/v0/auth` with an [`AuthRequest`] (which model and key the appliance wants) →
//!    an [`AuthResponse`]: a single-use session and a fresh 32-byte nonce (the challenge).
//! 2. `POST /kbs/v0/attest` with an [`AttestRequest`]: evidence whose runtime data binds the
//!    nonce (`challenge_bindings` holds SHA-256(nonce), no TLS exporter) and an ephemeral X25519
//!    public key (`key_release_x25519`), plus the manifest's wrapped key (the resource) → a
//!    [`ReleaseResponse`]: the model key sealed with HPKE to that ephemeral key.
//!
//! Errors are `{"error": {"message", "type"}}` ([`ErrorBody`]); 4xx answers are final refusals,
//! 5xx and transport failures may be retried with a new session.

use serde::{Deserialize, Serialize};

use crate::seal::manifest::WrappedKey;

/// The protocol version an appliance announces in [`AuthRequest::version`].
pub const PROTOCOL_VERSION: &str = "inferno-kbs-v1";
/// The path of the request step.
pub const AUTH_PATH: &str = "/kbs/v0/auth";
/// The path of the attestation step.
pub const ATTEST_PATH: &str = "/kbs/v0/attest";
/// HPKE `info` of a released key (distinct from the manifest's `inferno-seal-v1 model-key`, so
/// a release cannot be replayed as a manifest entry or the reverse).
pub const RELEASE_INFO: &[u8] = b"inferno-keybroker-v1 release";
/// Length of the challenge nonce.
pub const NONCE_LEN: usize = 32;
/// The largest request body the broker reads.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// Step 1: the appliance asks for the key of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthRequest {
    /// [`PROTOCOL_VERSION`].
    pub version: String,
    /// The appliance's TEE platform (`sev-snp` or `tdx`).
    pub tee: String,
    /// The model id the key is filed under (the manifest's `release.model_id`).
    pub model_id: String,
    /// The model key's id (the manifest's `key_id`).
    pub key_id: String,
}

/// Step 1's answer: the challenge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthResponse {
    /// The session id (16 random bytes, hex): valid for one attestation only.
    pub session: String,
    /// The challenge nonce ([`NONCE_LEN`] random bytes, hex).
    pub nonce: String,
    /// How long the challenge stays valid.
    pub expires_in_seconds: u64,
}

/// Step 2: the appliance's evidence and the resource it asks for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttestRequest {
    /// The session of step 1.
    pub session: String,
    /// The ephemeral X25519 public key the key is to be sealed to (hex); the evidence's runtime
    /// data must carry it as `key_release_x25519`.
    pub tee_pubkey: String,
    /// The evidence envelope (the same JSON as `GET /v1/attestation`'s `evidence`).
    pub evidence: serde_json::Value,
    /// The manifest's `wrapped_key`: the model key wrapped to this broker.
    pub wrapped_key: WrappedKey,
}

/// Step 2's answer: the released key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseResponse {
    /// The released key's id.
    pub key_id: String,
    /// The model key sealed with HPKE to `tee_pubkey` under [`RELEASE_INFO`].
    pub key: WrappedKey,
}

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The error's detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// One line saying why.
    pub message: String,
    /// `invalid_request`, `invalid_session`, `policy_refused` or `internal`.
    #[serde(rename = "type")]
    pub kind: String,
}
