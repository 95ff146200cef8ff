//! Audit records: request records, completion records and security events.
//!
//! Each record is stored as one compact JSON object (one Merkle leaf). The exact stored bytes
//! are what the tree hashes, so a verifier never needs to re-encode a record.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::content::SealedContent;

/// The record format version this build writes.
pub const RECORD_VERSION: u32 = 1;

/// One stored record: the envelope the writer adds around a [`RecordBody`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The record format version ([`RECORD_VERSION`]).
    pub v: u32,
    /// The record's leaf index in the log's Merkle tree.
    pub index: u64,
    /// When the writer accepted the record (RFC 3339, UTC).
    #[serde(
        serialize_with = "rfc3339_unallocated",
        deserialize_with = "time::serde::rfc3339::deserialize"
    )]
    pub time: OffsetDateTime,
    /// What the record says.
    #[serde(flatten)]
    pub body: RecordBody,
}

/// The three kinds of record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RecordBody {
    /// An API request was accepted (written before its response or first token).
    Request(RequestRecord),
    /// An API request finished (written after the response).
    Completion(CompletionRecord),
    /// A security-relevant event of the appliance.
    Event(SecurityEvent),
}

impl RecordBody {
    /// A short name of the record's kind: `request`, `completion` or the event name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Request(_) => "request",
            Self::Completion(_) => "completion",
            Self::Event(e) => e.name(),
        }
    }

    /// The request id, for request and completion records.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Self::Request(r) => Some(&r.request_id),
            Self::Completion(c) => Some(&c.request_id),
            Self::Event(_) => None,
        }
    }
}

/// An accepted API request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The request id the server generated and returned to the client (`x-request-id`):
    /// completion records are matched to requests by it.
    pub request_id: String,
    /// The client's own `X-Request-Id`, kept for correlation only, never for matching:
    /// printable ASCII, at most 128 bytes (longer ids are cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
    /// The API key id of the caller.
    pub principal: String,
    /// The endpoint, e.g. `/v1/chat/completions`.
    pub endpoint: String,
    /// The digest of the model that serves the request.
    pub model_digest: String,
    /// Whether the response is streamed.
    pub stream: bool,
    /// The prompt, as the content policy says.
    pub prompt: SealedContent,
    /// The HTTP status of a request answered without generation: a refusal (401, 400, 413,
    /// 404, 503, ...) or a call of another API endpoint. Such a request has no completion
    /// record. Absent for an accepted generation request, whose completion record carries the
    /// status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The grammar a constrained request followed (structured output, enforced tool call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<ConstraintNote>,
    /// How the request reached the server when not directly over its TLS connection: `ohttp`
    /// for a request sealed in Oblivious HTTP (RFC 9458). Absent for TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

/// How a request's output was constrained: the kind and the grammar's digest, never the
/// grammar itself (the request body, sealed as `prompt`, holds it as the content policy allows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConstraintNote {
    /// `json_object`, `json_schema`, `regex`, `choice`, `grammar` or `tool_call`.
    pub kind: String,
    /// Hex SHA-256 of the kind and the canonical grammar source.
    pub grammar_digest: String,
}

/// A finished API request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// The request id of the matching request record.
    pub request_id: String,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Why generation stopped (`stop`, `length`, ...), if it did.
    pub finish_reason: Option<String>,
    /// The HTTP status returned.
    pub status: u16,
    /// Time from request acceptance to the end of the response, in milliseconds.
    pub latency_ms: u64,
    /// The completion text, as the content policy says.
    pub completion: SealedContent,
}

/// Attestation evidence as carried in start events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceBlob {
    /// The evidence format, e.g. `sev-snp`, `tdx`, `nvidia-gpu`.
    pub kind: String,
    /// The raw evidence, base64.
    pub data_b64: String,
}

/// A security-relevant event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum SecurityEvent {
    /// The appliance (and this log writer) started. Carries the checkpoint verifier key of this
    /// run and the attestation evidence that binds it.
    Started {
        /// The software version.
        software_version: String,
        /// The note verifier key (`name+hash+base64`) that signs this run's checkpoints.
        checkpoint_key: String,
        /// Evidence whose runtime data binds `checkpoint_key`; empty outside a TEE.
        evidence: Vec<EvidenceBlob>,
    },
    /// The appliance is stopping.
    Stopped {
        /// Why.
        reason: String,
    },
    /// The checkpoint signing key changed at a restart.
    SigningKeyChanged {
        /// The previous run's verifier key, if the log had one.
        previous: Option<String>,
        /// This run's verifier key.
        current: String,
    },
    /// Evidence was collected and appraised.
    Appraisal {
        /// What was appraised (`cpu`, `gpu`, ...).
        subject: String,
        /// Hex SHA-256 of the attestation report.
        report_digest: String,
        /// Whether the appraisal passed.
        passed: bool,
        /// The appraisal's explanation.
        detail: String,
    },
    /// A sealed key was released, or its release refused.
    KeyRelease {
        /// The key's identifier.
        key_id: String,
        /// Whether the key was released.
        released: bool,
        /// Why (the refusal reason, or the policy that allowed it).
        reason: String,
    },
    /// The digests of the active policy and configuration.
    PolicyConfig {
        /// Hex SHA-256 of the attestation policy document, if one is in force.
        policy_digest: Option<String>,
        /// Hex SHA-256 of the configuration file, if one was given.
        config_digest: Option<String>,
        /// The content policy in force (`none`, `hmac`, `encrypted`).
        content_mode: String,
    },
    /// The GPU changed readiness (confidential-computing mode, attestation, engine warm-up), or
    /// the model started serving on the CPU backend (then `ready` is false: no GPU serves).
    GpuReady {
        /// Whether a GPU is ready to serve.
        ready: bool,
        /// Details.
        detail: String,
    },
    /// The TLS certificate was rotated.
    CertificateRotated {
        /// Hex SHA-256 of the new certificate (DER).
        certificate_digest: String,
    },
    /// The log recovered from a crash: it truncated an unacknowledged torn tail, or found
    /// unacknowledged records past the last signed checkpoint (`truncated_bytes` 0) and signs
    /// them at this start.
    Recovery {
        /// The segment file that was truncated.
        segment: String,
        /// The byte offset it was truncated to.
        offset: u64,
        /// The number of bytes removed.
        truncated_bytes: u64,
        /// What was wrong with the removed bytes.
        reason: String,
    },
}

impl SecurityEvent {
    /// Every event name, as stored in the `event` field.
    pub const NAMES: [&'static str; 9] = [
        "started",
        "stopped",
        "signing_key_changed",
        "appraisal",
        "key_release",
        "policy_config",
        "gpu_ready",
        "certificate_rotated",
        "recovery",
    ];

    /// The event's name as stored in the `event` field.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Started { .. } => "started",
            Self::Stopped { .. } => "stopped",
            Self::SigningKeyChanged { .. } => "signing_key_changed",
            Self::Appraisal { .. } => "appraisal",
            Self::KeyRelease { .. } => "key_release",
            Self::PolicyConfig { .. } => "policy_config",
            Self::GpuReady { .. } => "gpu_ready",
            Self::CertificateRotated { .. } => "certificate_rotated",
            Self::Recovery { .. } => "recovery",
        }
    }
}

/// Longest RFC 3339 rendering of a UTC time the writer produces (with nanoseconds).
const MAX_RFC3339_LEN: usize = 40;

/// Serialises `time` as RFC 3339 (the same text as `time::serde::rfc3339`) without a heap
/// allocation: the writer does this once per record.
fn rfc3339_unallocated<S: serde::Serializer>(
    time: &OffsetDateTime,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::Error as _;
    let mut buf = [0u8; MAX_RFC3339_LEN];
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    time.format_into(&mut cursor, &time::format_description::well_known::Rfc3339)
        .map_err(S::Error::custom)?;
    let len = usize::try_from(cursor.position()).map_err(S::Error::custom)?;
    let text = std::str::from_utf8(&buf[..len]).map_err(S::Error::custom)?;
    serializer.serialize_str(text)
}

impl Record {
    /// Encodes the record as its stored (leaf) bytes.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// Appends the record's stored (leaf) bytes to `out` (the same bytes as [`Record::encode`]).
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        serde_json::to_writer(out, self)
    }

    /// Decodes stored (leaf) bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_type_tags() {
        let r = Record {
            v: RECORD_VERSION,
            index: 5,
            time: time::macros::datetime!(2026-01-02 03:04:05 UTC),
            body: RecordBody::Event(SecurityEvent::GpuReady {
                ready: true,
                detail: "cc mode on".into(),
            }),
        };
        let bytes = r.encode().expect("encodes");
        let text = String::from_utf8(bytes.clone()).expect("utf8");
        assert!(
            text.contains(r#""type":"event","event":"gpu_ready""#),
            "{text}"
        );
        assert_eq!(Record::decode(&bytes).expect("decodes"), r);
    }

    #[test]
    fn times_render_as_time_crate_rfc3339() {
        for time in [
            time::macros::datetime!(2026-01-02 03:04:05 UTC),
            time::macros::datetime!(2026-12-31 23:59:59.123456789 UTC),
            OffsetDateTime::now_utc(),
        ] {
            let r = Record {
                v: RECORD_VERSION,
                index: 0,
                time,
                body: RecordBody::Event(SecurityEvent::Stopped { reason: "x".into() }),
            };
            let mut encoded = Vec::new();
            r.encode_into(&mut encoded).expect("encodes");
            let expected = time
                .format(&time::format_description::well_known::Rfc3339)
                .expect("formats");
            let text = String::from_utf8(encoded).expect("utf8");
            assert!(text.contains(&format!("\"time\":\"{expected}\"")), "{text}");
        }
    }
}
