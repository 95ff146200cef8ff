//! The runtime-data document: what a running instance vouches for, bound into its evidence.
//!
//! The document is serialised canonically (JSON, keys sorted, no whitespace, absent fields
//! omitted, byte strings as lowercase hex) and its SHA-512 is the SEV-SNP / TDX `REPORT_DATA`.
//! `docs/runtime-data.md` is the normative description.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha512};

/// The only schema version this crate produces and accepts.
pub const RUNTIME_DATA_VERSION: u32 = 1;

/// Errors when decoding a runtime-data document.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDataError {
    /// The bytes are not a JSON runtime-data document.
    #[error("runtime-data document is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
    /// The document declares a version this crate does not know.
    #[error(
        "runtime-data document version {found} is not supported (expected {RUNTIME_DATA_VERSION})"
    )]
    Version {
        /// The version found in the document.
        found: u32,
    },
    /// The bytes parse but are not in canonical form.
    #[error("runtime-data document is not in canonical form (sorted keys, no whitespace)")]
    NotCanonical,
    /// A hex field has the wrong length or alphabet.
    #[error("runtime-data field `{field}`: {reason}")]
    Field {
        /// The offending field.
        field: &'static str,
        /// Why it is invalid.
        reason: String,
    },
}

/// The runtime-data document, version 1.
///
/// Fields are declared in sorted order: serde serialises struct fields in declaration order,
/// which makes [`RuntimeData::to_canonical_bytes`] emit sorted keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeData {
    /// The audit-log signing key: a raw 32-byte Ed25519 public key, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_key: Option<String>,
    /// A verifier-chosen nonce (1 to 64 bytes), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// SHA-256 of the exact bytes of the server policy file, hex.
    pub policy_sha256: String,
    /// The version string of the serving software.
    pub software_version: String,
    /// A TLS exporter value (RFC 5705 / RFC 8446 §7.5) binding the evidence to one session, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_exporter: Option<String>,
    /// SHA-256 of the DER SubjectPublicKeyInfo of the server's TLS key, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_spki_sha256: Option<String>,
    /// SHA-256 of the vTPM attestation key's DER SubjectPublicKeyInfo, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm_ak_sha256: Option<String>,
    /// The schema version; always [`RUNTIME_DATA_VERSION`].
    pub version: u32,
}

impl RuntimeData {
    /// A version-1 document with only the mandatory fields set.
    pub fn new(policy_sha256: [u8; 32], software_version: impl Into<String>) -> Self {
        Self {
            audit_key: None,
            nonce: None,
            policy_sha256: hex::encode(policy_sha256),
            software_version: software_version.into(),
            tls_exporter: None,
            tls_spki_sha256: None,
            tpm_ak_sha256: None,
            version: RUNTIME_DATA_VERSION,
        }
    }

    /// Checks the version and the shape of every hex field.
    pub fn validate(&self) -> Result<(), RuntimeDataError> {
        if self.version != RUNTIME_DATA_VERSION {
            return Err(RuntimeDataError::Version {
                found: self.version,
            });
        }
        check_hex("policy_sha256", Some(&self.policy_sha256), 32..=32)?;
        check_hex("audit_key", self.audit_key.as_deref(), 32..=32)?;
        check_hex("nonce", self.nonce.as_deref(), 1..=64)?;
        check_hex("tls_exporter", self.tls_exporter.as_deref(), 16..=64)?;
        check_hex("tls_spki_sha256", self.tls_spki_sha256.as_deref(), 32..=32)?;
        check_hex("tpm_ak_sha256", self.tpm_ak_sha256.as_deref(), 32..=32)?;
        Ok(())
    }

    /// The canonical serialisation: compact JSON with sorted keys.
    pub fn to_canonical_bytes(&self) -> Vec<u8> {
        // Serialising a plain struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a document, requiring a known version, valid fields and canonical form.
    pub fn from_canonical_bytes(bytes: &[u8]) -> Result<Self, RuntimeDataError> {
        let doc: Self = serde_json::from_slice(bytes)?;
        doc.validate()?;
        if doc.to_canonical_bytes() != bytes {
            return Err(RuntimeDataError::NotCanonical);
        }
        Ok(doc)
    }

    /// SHA-512 of the canonical serialisation: the value placed in `REPORT_DATA`.
    pub fn report_data(&self) -> [u8; 64] {
        Sha512::digest(self.to_canonical_bytes()).into()
    }

    /// The vTPM quote's qualifying data (`extraData`): SHA-256 of the canonical serialisation.
    /// A TPM accepts qualifying data no longer than its largest digest, and common vTPMs stop at
    /// SHA-256 or SHA-384, so the 64-byte REPORT_DATA value would be refused there.
    pub fn tpm_qualifying_data(&self) -> [u8; 32] {
        self.sha256()
    }

    /// The 32-byte SPDM nonce for GPU evidence: SHA-256 of the canonical serialisation.
    pub fn gpu_nonce(&self) -> [u8; 32] {
        self.sha256()
    }

    fn sha256(&self) -> [u8; 32] {
        sha2::Sha256::digest(self.to_canonical_bytes()).into()
    }
}

fn check_hex(
    field: &'static str,
    value: Option<&str>,
    len: std::ops::RangeInclusive<usize>,
) -> Result<(), RuntimeDataError> {
    let Some(value) = value else {
        return Ok(());
    };
    if value.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(RuntimeDataError::Field {
            field,
            reason: "hex must be lowercase".into(),
        });
    }
    let bytes = hex::decode(value).map_err(|e| RuntimeDataError::Field {
        field,
        reason: e.to_string(),
    })?;
    if !len.contains(&bytes.len()) {
        return Err(RuntimeDataError::Field {
            field,
            reason: format!(
                "{} bytes, expected {} to {}",
                bytes.len(),
                len.start(),
                len.end()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RuntimeData {
        let mut doc = RuntimeData::new([7; 32], "inferno/0.1.0");
        doc.nonce = Some("00ff".into());
        doc.tls_spki_sha256 = Some(hex::encode([1; 32]));
        doc.audit_key = Some(hex::encode([2; 32]));
        doc
    }

    #[test]
    fn canonical_form_has_sorted_keys_and_round_trips() {
        let doc = sample();
        let bytes = doc.to_canonical_bytes();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert!(!bytes.contains(&b' '));
        assert_eq!(RuntimeData::from_canonical_bytes(&bytes).unwrap(), doc);
    }

    #[test]
    fn report_data_is_sha512_of_canonical_bytes() {
        let doc = sample();
        let expected: [u8; 64] = Sha512::digest(doc.to_canonical_bytes()).into();
        assert_eq!(doc.report_data(), expected);
    }

    #[test]
    fn rejects_non_canonical_unknown_and_bad_fields() {
        let doc = sample();
        let pretty = serde_json::to_vec_pretty(&doc).unwrap();
        assert!(matches!(
            RuntimeData::from_canonical_bytes(&pretty),
            Err(RuntimeDataError::NotCanonical)
        ));
        let unknown = br#"{"extra":1,"policy_sha256":"00","software_version":"x","version":1}"#;
        assert!(RuntimeData::from_canonical_bytes(unknown).is_err());
        let mut bad = sample();
        bad.policy_sha256 = "ab".into();
        assert!(matches!(
            bad.validate(),
            Err(RuntimeDataError::Field {
                field: "policy_sha256",
                ..
            })
        ));
        let mut v2 = sample();
        v2.version = 2;
        assert!(matches!(
            v2.validate(),
            Err(RuntimeDataError::Version { found: 2 })
        ));
    }
}
