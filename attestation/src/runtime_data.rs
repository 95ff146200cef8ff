//! The runtime-data document: what a running instance vouches for, bound into its evidence.
//!
//! The document is serialised canonically (JSON, keys sorted, no whitespace, absent fields
//! omitted, byte strings as lowercase hex) and its SHA-512 is the SEV-SNP / TDX `REPORT_DATA`.
//! `docs/runtime-data.md` is the normative description; `docs/attestation-protocol.md` says how
//! a client checks a challenge binding and reads the evidence from the server's certificate.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};

/// The schema version this crate produces. Decoding also accepts [`RUNTIME_DATA_VERSION_2`]
/// and [`RUNTIME_DATA_VERSION_1`].
pub const RUNTIME_DATA_VERSION: u32 = 3;

/// The schema version before `ohttp_key_config_sha256`, still accepted when decoding.
pub const RUNTIME_DATA_VERSION_2: u32 = 2;

/// The previous schema version, still accepted when decoding (old audit logs carry it).
pub const RUNTIME_DATA_VERSION_1: u32 = 1;

/// The TLS exporter label (RFC 8446 §7.5) of the fresh-evidence exchange; no context is used.
pub const TLS_EXPORTER_LABEL: &[u8] = b"EXPORTER-inferno-attestation-v1";

/// The length in bytes of the TLS exporter value of the fresh-evidence exchange.
pub const TLS_EXPORTER_LEN: usize = 32;

/// The shortest client nonce a fresh-evidence request accepts, in bytes.
pub const MIN_CHALLENGE_NONCE: usize = 16;

/// The longest client nonce a fresh-evidence request accepts, in bytes.
pub const MAX_CHALLENGE_NONCE: usize = 64;

/// The most challenge bindings one document carries.
pub const MAX_CHALLENGE_BINDINGS: usize = 64;

/// The X.509 extension under which the server certificate carries its start-up evidence: a 2.25
/// OID made from the UUID `0edd0a4e-f550-4d16-a825-9f0eef4f4657`.
pub const EVIDENCE_EXTENSION_OID: &str = "2.25.19756898626538637267843638316466390615";

/// [`EVIDENCE_EXTENSION_OID`] as the DER contents octets of an OBJECT IDENTIFIER (without tag
/// and length). Its last arc does not fit 64 bits, so it is given as bytes, not as arcs.
pub const EVIDENCE_EXTENSION_OID_DER: &[u8] = &[
    0x69, 0x9d, 0xdd, 0x85, 0x93, 0xde, 0xd5, 0x82, 0xb4, 0xad, 0xa8, 0x92, 0xe7, 0xe1, 0xee, 0xfa,
    0xbd, 0x8c, 0x57,
];

/// The challenge binding of a client nonce to one TLS connection:
/// SHA-256( nonce ‖ exporter ), where `exporter` is that connection's exporter value under
/// [`TLS_EXPORTER_LABEL`] (32 bytes, no context).
pub fn challenge_binding(nonce: &[u8], exporter: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(nonce);
    hash.update(exporter);
    hash.finalize().into()
}

/// The challenge binding of a client nonce sent inside an Oblivious HTTP request (RFC 9458):
/// SHA-256( nonce ‖ key_id ‖ public_key ), where `key_id` and `public_key` are those of the
/// gateway key configuration the request was encapsulated to. Only the holder of that key's
/// private half can read the nonce, so evidence carrying this binding was requested by it.
pub fn ohttp_challenge_binding(nonce: &[u8], key_id: u8, public_key: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(nonce);
    hash.update([key_id]);
    hash.update(public_key);
    hash.finalize().into()
}

/// Errors when decoding a runtime-data document.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDataError {
    /// The bytes are not a JSON runtime-data document.
    #[error("runtime-data document is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
    /// The document declares a version this crate does not know.
    #[error(
        "runtime-data document version {found} is not supported (expected {RUNTIME_DATA_VERSION_1} to {RUNTIME_DATA_VERSION})"
    )]
    Version {
        /// The version found in the document.
        found: u32,
    },
    /// The bytes parse but are not in canonical form.
    #[error(
        "runtime-data document is not in canonical form (sorted keys, no whitespace, empty lists omitted)"
    )]
    NotCanonical,
    /// A field has the wrong length, alphabet or shape, or is not allowed in its version.
    #[error("runtime-data field `{field}`: {reason}")]
    Field {
        /// The offending field.
        field: &'static str,
        /// Why it is invalid.
        reason: String,
    },
}

/// The runtime-data document, version 3 (version 1 and 2 documents decode into it unchanged).
///
/// Fields are declared in sorted order: serde serialises struct fields in declaration order,
/// which makes [`RuntimeData::to_canonical_bytes`] emit sorted keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeData {
    /// The audit-log signing key: a raw 32-byte Ed25519 public key, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_key: Option<String>,
    /// The challenge bindings this evidence answers ([`challenge_binding`] of each client nonce
    /// and its connection's TLS exporter), 32-byte hex strings sorted ascending without
    /// duplicates, 1 to [`MAX_CHALLENGE_BINDINGS`] of them; empty (omitted) in start-up evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub challenge_bindings: Vec<String>,
    /// The X25519 public key to which a key broker releases sealed-weight keys, 32 bytes hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_release_x25519: Option<String>,
    /// The digest of the served model (`inferno_model` digest, as `inferno serve` prints and
    /// `/v1/models` returns), 32 bytes hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_digest: Option<String>,
    /// SHA-256 of the server's Oblivious HTTP key configuration (RFC 9458 §3, the single
    /// encoded configuration that `/.well-known/ohttp-gateway` lists), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ohttp_key_config_sha256: Option<String>,
    /// SHA-256 of the exact bytes of the server policy file, hex.
    pub policy_sha256: String,
    /// The format the server quantizes a 16-bit checkpoint's projections to when it loads it
    /// (`fp8`), when it does: the weights it computes with then differ from the files
    /// `model_digest` covers (a checkpoint's own format is part of those files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized_at_load: Option<String>,
    /// The version string of the serving software.
    pub software_version: String,
    /// SHA-256 of the DER SubjectPublicKeyInfo of the server's TLS key, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_spki_sha256: Option<String>,
    /// SHA-256 of the vTPM attestation key's DER SubjectPublicKeyInfo, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm_ak_sha256: Option<String>,
    /// The schema version: [`RUNTIME_DATA_VERSION`] for every document this crate produces.
    pub version: u32,
}

impl RuntimeData {
    /// A version-2 document with only the mandatory fields set.
    pub fn new(policy_sha256: [u8; 32], software_version: impl Into<String>) -> Self {
        Self {
            audit_key: None,
            challenge_bindings: Vec::new(),
            key_release_x25519: None,
            model_digest: None,
            ohttp_key_config_sha256: None,
            policy_sha256: hex::encode(policy_sha256),
            quantized_at_load: None,
            software_version: software_version.into(),
            tls_spki_sha256: None,
            tpm_ak_sha256: None,
            version: RUNTIME_DATA_VERSION,
        }
    }

    /// Sets the challenge bindings (sorted and deduplicated here); none leaves the field absent.
    pub fn set_challenge_bindings(
        &mut self,
        bindings: impl IntoIterator<Item = [u8; 32]>,
    ) -> Result<(), RuntimeDataError> {
        let mut bindings: Vec<[u8; 32]> = bindings.into_iter().collect();
        bindings.sort_unstable();
        bindings.dedup();
        if bindings.len() > MAX_CHALLENGE_BINDINGS {
            return Err(RuntimeDataError::Field {
                field: "challenge_bindings",
                reason: format!(
                    "{} bindings, at most {MAX_CHALLENGE_BINDINGS} allowed",
                    bindings.len()
                ),
            });
        }
        self.challenge_bindings = bindings.iter().map(hex::encode).collect();
        Ok(())
    }

    /// Whether the document carries the challenge binding of `nonce` on the connection whose
    /// TLS exporter value is `exporter`.
    pub fn binds_challenge(&self, nonce: &[u8], exporter: &[u8]) -> bool {
        let expected = hex::encode(challenge_binding(nonce, exporter));
        self.challenge_bindings.contains(&expected)
    }

    /// Checks the version and the shape of every field.
    pub fn validate(&self) -> Result<(), RuntimeDataError> {
        match self.version {
            RUNTIME_DATA_VERSION => {}
            RUNTIME_DATA_VERSION_2 => {
                if self.ohttp_key_config_sha256.is_some() {
                    return Err(RuntimeDataError::Field {
                        field: "ohttp_key_config_sha256",
                        reason: "not part of a version 2 document".into(),
                    });
                }
            }
            RUNTIME_DATA_VERSION_1 => {
                for (field, present) in [
                    ("challenge_bindings", !self.challenge_bindings.is_empty()),
                    ("key_release_x25519", self.key_release_x25519.is_some()),
                    ("model_digest", self.model_digest.is_some()),
                    (
                        "ohttp_key_config_sha256",
                        self.ohttp_key_config_sha256.is_some(),
                    ),
                ] {
                    if present {
                        return Err(RuntimeDataError::Field {
                            field,
                            reason: "not part of a version 1 document".into(),
                        });
                    }
                }
            }
            found => return Err(RuntimeDataError::Version { found }),
        }
        check_hex("policy_sha256", Some(&self.policy_sha256), 32..=32)?;
        check_hex("audit_key", self.audit_key.as_deref(), 32..=32)?;
        check_hex(
            "key_release_x25519",
            self.key_release_x25519.as_deref(),
            32..=32,
        )?;
        check_hex("model_digest", self.model_digest.as_deref(), 32..=32)?;
        check_hex(
            "ohttp_key_config_sha256",
            self.ohttp_key_config_sha256.as_deref(),
            32..=32,
        )?;
        if let Some(format) = &self.quantized_at_load
            && !matches!(format.as_str(), "fp8")
        {
            return Err(RuntimeDataError::Field {
                field: "quantized_at_load",
                reason: format!("unknown format `{format}` (fp8)"),
            });
        }
        check_hex("tls_spki_sha256", self.tls_spki_sha256.as_deref(), 32..=32)?;
        check_hex("tpm_ak_sha256", self.tpm_ak_sha256.as_deref(), 32..=32)?;
        for binding in &self.challenge_bindings {
            check_hex("challenge_bindings", Some(binding), 32..=32)?;
        }
        if self.challenge_bindings.len() > MAX_CHALLENGE_BINDINGS {
            return Err(RuntimeDataError::Field {
                field: "challenge_bindings",
                reason: format!(
                    "{} bindings, at most {MAX_CHALLENGE_BINDINGS} allowed",
                    self.challenge_bindings.len()
                ),
            });
        }
        if !self.challenge_bindings.windows(2).all(|w| w[0] < w[1]) {
            return Err(RuntimeDataError::Field {
                field: "challenge_bindings",
                reason: "entries must be sorted ascending without duplicates".into(),
            });
        }
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
        Sha256::digest(self.to_canonical_bytes()).into()
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
        doc.tls_spki_sha256 = Some(hex::encode([1; 32]));
        doc.audit_key = Some(hex::encode([2; 32]));
        doc.model_digest = Some(hex::encode([3; 32]));
        doc.key_release_x25519 = Some(hex::encode([4; 32]));
        doc.ohttp_key_config_sha256 = Some(hex::encode([6; 32]));
        doc.set_challenge_bindings([[9; 32], [5; 32]]).unwrap();
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
        assert_eq!(keys.len(), 9, "every field but tpm_ak_sha256: {value}");
        assert!(!bytes.contains(&b' '));
        assert_eq!(value["version"], RUNTIME_DATA_VERSION);
        assert_eq!(RuntimeData::from_canonical_bytes(&bytes).unwrap(), doc);
    }

    #[test]
    fn report_data_is_sha512_of_canonical_bytes() {
        let doc = sample();
        let expected: [u8; 64] = Sha512::digest(doc.to_canonical_bytes()).into();
        assert_eq!(doc.report_data(), expected);
    }

    #[test]
    fn challenge_bindings_are_sorted_deduplicated_and_checked() {
        let nonce = [0xab; 16];
        let exporter = [0xcd; TLS_EXPORTER_LEN];
        let binding = challenge_binding(&nonce, &exporter);
        let mut concatenated = nonce.to_vec();
        concatenated.extend_from_slice(&exporter);
        assert_eq!(binding, <[u8; 32]>::from(Sha256::digest(&concatenated)));

        let mut doc = RuntimeData::new([7; 32], "x");
        doc.set_challenge_bindings([[0xff; 32], binding, [0x01; 32], binding])
            .unwrap();
        assert_eq!(doc.challenge_bindings.len(), 3);
        assert_eq!(doc.challenge_bindings[0], hex::encode([0x01; 32]));
        assert_eq!(doc.challenge_bindings[2], hex::encode([0xff; 32]));
        assert!(doc.binds_challenge(&nonce, &exporter));
        assert!(!doc.binds_challenge(&nonce, &[0xce; TLS_EXPORTER_LEN]));
        assert!(!doc.binds_challenge(&[0xab; 17], &exporter));
        doc.validate().unwrap();

        // No bindings: the field is absent, not an empty list.
        let mut empty = RuntimeData::new([7; 32], "x");
        empty.set_challenge_bindings([]).unwrap();
        assert!(
            !String::from_utf8(empty.to_canonical_bytes())
                .unwrap()
                .contains("challenge_bindings")
        );
        let with_empty_list =
            br#"{"challenge_bindings":[],"policy_sha256":"0707070707070707070707070707070707070707070707070707070707070707","software_version":"x","version":2}"#;
        assert!(matches!(
            RuntimeData::from_canonical_bytes(with_empty_list),
            Err(RuntimeDataError::NotCanonical)
        ));

        // Unsorted, duplicated or too many entries are refused.
        let mut unsorted = doc.clone();
        unsorted.challenge_bindings.reverse();
        assert!(matches!(
            unsorted.validate(),
            Err(RuntimeDataError::Field {
                field: "challenge_bindings",
                ..
            })
        ));
        let mut duplicated = doc.clone();
        duplicated.challenge_bindings[1] = duplicated.challenge_bindings[0].clone();
        assert!(duplicated.validate().is_err());
        let too_many = (0..=MAX_CHALLENGE_BINDINGS).map(|i| {
            let mut b = [0; 32];
            b[..8].copy_from_slice(&(i as u64).to_be_bytes());
            b
        });
        assert!(doc.set_challenge_bindings(too_many).is_err());
    }

    #[test]
    fn version_2_documents_decode_without_the_ohttp_key_config() {
        let v2 = br#"{"policy_sha256":"0707070707070707070707070707070707070707070707070707070707070707","software_version":"x","version":2}"#;
        let doc = RuntimeData::from_canonical_bytes(v2).unwrap();
        assert_eq!(doc.version, RUNTIME_DATA_VERSION_2);
        assert_eq!(doc.to_canonical_bytes(), v2);
        let mut mixed = doc;
        mixed.ohttp_key_config_sha256 = Some(hex::encode([6; 32]));
        assert!(matches!(
            mixed.validate(),
            Err(RuntimeDataError::Field {
                field: "ohttp_key_config_sha256",
                ..
            })
        ));
    }

    #[test]
    fn version_1_documents_still_decode() {
        let v1 = br#"{"audit_key":"0202020202020202020202020202020202020202020202020202020202020202","policy_sha256":"0707070707070707070707070707070707070707070707070707070707070707","software_version":"inferno/0.1.0","tls_spki_sha256":"0101010101010101010101010101010101010101010101010101010101010101","version":1}"#;
        let doc = RuntimeData::from_canonical_bytes(v1).unwrap();
        assert_eq!(doc.version, RUNTIME_DATA_VERSION_1);
        assert_eq!(doc.to_canonical_bytes(), v1);
        assert_eq!(doc.report_data(), <[u8; 64]>::from(Sha512::digest(v1)));
        // A version 1 document cannot carry version 2 fields.
        let mut mixed = doc;
        mixed.model_digest = Some(hex::encode([3; 32]));
        assert!(matches!(
            mixed.validate(),
            Err(RuntimeDataError::Field {
                field: "model_digest",
                ..
            })
        ));
        // The v1 fields that were never filled are gone.
        let v1_nonce = br#"{"nonce":"00ff","policy_sha256":"0707070707070707070707070707070707070707070707070707070707070707","software_version":"x","version":1}"#;
        assert!(RuntimeData::from_canonical_bytes(v1_nonce).is_err());
    }

    #[test]
    fn rejects_non_canonical_unknown_and_bad_fields() {
        let doc = sample();
        let pretty = serde_json::to_vec_pretty(&doc).unwrap();
        assert!(matches!(
            RuntimeData::from_canonical_bytes(&pretty),
            Err(RuntimeDataError::NotCanonical)
        ));
        let unknown = br#"{"extra":1,"policy_sha256":"00","software_version":"x","version":2}"#;
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
        let mut bad_model = sample();
        bad_model.model_digest = Some(hex::encode([3; 31]));
        assert!(matches!(
            bad_model.validate(),
            Err(RuntimeDataError::Field {
                field: "model_digest",
                ..
            })
        ));
        let mut quantized = sample();
        quantized.quantized_at_load = Some("fp8".into());
        quantized.validate().unwrap();
        quantized.quantized_at_load = Some("int3".into());
        assert!(matches!(
            quantized.validate(),
            Err(RuntimeDataError::Field {
                field: "quantized_at_load",
                ..
            })
        ));
        let mut v4 = sample();
        v4.version = 4;
        assert!(matches!(
            v4.validate(),
            Err(RuntimeDataError::Version { found: 4 })
        ));
    }

    #[test]
    fn evidence_extension_oid_der_encodes_the_dotted_oid() {
        let mut arcs = EVIDENCE_EXTENSION_OID.split('.');
        let first: u128 = arcs.next().unwrap().parse().unwrap();
        let second: u128 = arcs.next().unwrap().parse().unwrap();
        let mut der = Vec::new();
        for arc in
            std::iter::once(first * 40 + second).chain(arcs.map(|a| a.parse::<u128>().unwrap()))
        {
            let mut groups = vec![(arc & 0x7f) as u8];
            let mut rest = arc >> 7;
            while rest > 0 {
                groups.push((rest & 0x7f) as u8 | 0x80);
                rest >>= 7;
            }
            groups.reverse();
            der.extend(groups);
        }
        assert_eq!(der, EVIDENCE_EXTENSION_OID_DER);
    }
}
