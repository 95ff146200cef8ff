//! The model key sealed to the (v)TPM under a PCR policy (`inferno seal --tpm-seal BLOB`,
//! `[model.key] source = "tpm"`).
//!
//! Sealing creates a TPM keyed-hash data object holding the 32-byte model key under a storage
//! primary key of the owner hierarchy (a fixed template, so the same TPM recreates the same
//! parent), with `fixedTPM`, `fixedParent`, no user auth and an authorization policy of
//! `TPM2_PolicyPCR` over the selected SHA-256 PCRs at their current values. The blob file holds
//! the object's public and private areas (the private area is encrypted by the TPM under the
//! parent: only this TPM can load it) and, for diagnostics, the PCR values it was sealed to.
//! Unsealing loads the object and runs `TPM2_Unseal` in a policy session that satisfied
//! `TPM2_PolicyPCR` with the PCRs' values now: any PCR that changed makes the TPM refuse.

use std::path::Path;
use std::str::FromStr as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use tss_esapi::Context;
use tss_esapi::attributes::{ObjectAttributesBuilder, SessionAttributesBuilder};
use tss_esapi::constants::SessionType;
use tss_esapi::handles::{KeyHandle, ObjectHandle, SessionHandle};
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::Hierarchy;
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    Digest, KeyedHashScheme, PcrSelectionList, PcrSelectionListBuilder, PcrSlot, Private, Public,
    PublicBuilder, PublicKeyedHashParameters, RsaExponent, SensitiveData, SymmetricDefinition,
    SymmetricDefinitionObject,
};
use tss_esapi::tcti_ldr::TctiNameConf;
use tss_esapi::traits::{Marshall as _, UnMarshall as _};
use zeroize::Zeroizing;

use super::key::{KEY_LEN, ModelKey};

/// The blob's `format`.
pub const BLOB_FORMAT: &str = "inferno-tpm-sealed-key";
/// The blob format version.
pub const BLOB_VERSION: u32 = 1;
/// The TPM used when none is named: the kernel's resource manager.
pub const DEFAULT_TCTI: &str = "device:/dev/tpmrm0";
/// The PCRs sealed to when none are named: firmware, its configuration, option ROMs, boot
/// loader and Secure Boot state (the same set the server quotes by default).
pub const DEFAULT_PCRS: &[u8] = &[0, 1, 2, 3, 4, 5, 6, 7];

/// Sealing to or unsealing from the TPM failed. One line each.
#[derive(Debug, thiserror::Error)]
pub enum TpmSealError {
    /// A TPM command failed.
    #[error("TPM: {what}: {cause}")]
    Tpm {
        /// What was being done.
        what: String,
        /// The TPM or TSS error.
        cause: String,
    },
    /// The PCRs differ from those the key was sealed to: the TPM refuses to unseal.
    #[error(
        "TPM: the key is sealed to other PCR values (changed since sealing: {changed}); the measured boot state differs"
    )]
    PcrMismatch {
        /// The PCRs whose values changed, e.g. `16`.
        changed: String,
    },
    /// The blob file is unusable.
    #[error("TPM sealed key {path}: {reason}")]
    Blob {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// A PCR value the key was sealed to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedPcr {
    /// The PCR index.
    pub index: u8,
    /// Its SHA-256 bank value at sealing, hex.
    pub sha256: String,
}

/// The sealed-key blob (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmSealedKey {
    /// Always [`BLOB_FORMAT`].
    pub format: String,
    /// [`BLOB_VERSION`].
    pub version: u32,
    /// The sealed model key's id.
    pub key_id: String,
    /// The SHA-256 bank PCRs of the policy and their values at sealing.
    pub pcrs: Vec<SealedPcr>,
    /// The policy digest (the object's authPolicy), hex.
    pub policy_digest: String,
    /// The data object's marshalled TPMT_PUBLIC, base64.
    pub public: String,
    /// The data object's TPM2B_PRIVATE contents (encrypted by the TPM), base64.
    pub private: String,
}

fn tss(what: &str) -> impl FnOnce(tss_esapi::Error) -> TpmSealError + '_ {
    move |e| TpmSealError::Tpm {
        what: what.to_owned(),
        cause: e.to_string(),
    }
}

fn open(tcti: &str) -> Result<Context, TpmSealError> {
    let conf = TctiNameConf::from_str(tcti).map_err(tss(&format!("TCTI `{tcti}`")))?;
    Context::new(conf).map_err(tss(&format!("opening the TPM `{tcti}`")))
}

fn selection(pcrs: &[u8]) -> Result<PcrSelectionList, TpmSealError> {
    let slots = pcrs
        .iter()
        .map(|&pcr| {
            if pcr >= 24 {
                return Err(TpmSealError::Tpm {
                    what: "PCR selection".into(),
                    cause: format!("PCR {pcr} out of range (0..=23)"),
                });
            }
            PcrSlot::try_from(1u32 << pcr).map_err(tss("PCR selection"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    PcrSelectionListBuilder::new()
        .with_selection(HashingAlgorithm::Sha256, &slots)
        .build()
        .map_err(tss("PCR selection"))
}

/// The current SHA-256 values of `pcrs`.
fn read_pcrs(ctx: &mut Context, pcrs: &[u8]) -> Result<Vec<SealedPcr>, TpmSealError> {
    let data = tss_esapi::abstraction::pcr::read_all(ctx, selection(pcrs)?)
        .map_err(tss("TPM2_PCR_Read"))?;
    let bank = data
        .pcr_bank(HashingAlgorithm::Sha256)
        .ok_or_else(|| TpmSealError::Tpm {
            what: "TPM2_PCR_Read".into(),
            cause: "the TPM has no SHA-256 bank".into(),
        })?;
    Ok(bank
        .into_iter()
        .map(|(slot, digest)| SealedPcr {
            index: u32::from(*slot).trailing_zeros() as u8,
            sha256: hex::encode(digest.value()),
        })
        .collect())
}

/// The storage parent: an RSA-2048 restricted decryption key of the owner hierarchy from a
/// fixed template (the same TPM recreates the same key).
fn parent(ctx: &mut Context) -> Result<KeyHandle, TpmSealError> {
    let template = tss_esapi::utils::create_restricted_decryption_rsa_public(
        SymmetricDefinitionObject::AES_128_CFB,
        RsaKeyBits::Rsa2048,
        RsaExponent::default(),
    )
    .map_err(tss("the storage key template"))?;
    ctx.execute_with_nullauth_session(|c| {
        c.create_primary(Hierarchy::Owner, template, None, None, None, None)
    })
    .map(|created| created.key_handle)
    .map_err(tss("creating the storage key"))
}

/// Starts a policy (or trial) session with PolicyPCR over `pcrs` at their current values.
fn pcr_policy_session(
    ctx: &mut Context,
    kind: SessionType,
    pcrs: &[u8],
) -> Result<AuthSession, TpmSealError> {
    let session = ctx
        .start_auth_session(
            None,
            None,
            None,
            kind,
            SymmetricDefinition::AES_128_CFB,
            HashingAlgorithm::Sha256,
        )
        .map_err(tss("starting a policy session"))?
        .ok_or_else(|| TpmSealError::Tpm {
            what: "starting a policy session".into(),
            cause: "the TPM returned no session".into(),
        })?;
    let (attributes, mask) = SessionAttributesBuilder::new()
        .with_decrypt(true)
        .with_encrypt(true)
        .build();
    ctx.tr_sess_set_attributes(session, attributes, mask)
        .map_err(tss("session attributes"))?;
    let policy = PolicySession::try_from(session).map_err(tss("policy session"))?;
    ctx.policy_pcr(policy, Digest::default(), selection(pcrs)?)
        .map_err(tss("TPM2_PolicyPCR"))?;
    Ok(session)
}

fn flush(ctx: &mut Context, handle: ObjectHandle) {
    if let Err(e) = ctx.flush_context(handle) {
        tracing::warn!(error = %e, "flushing a TPM handle failed");
    }
}

/// Seals `key` to `pcrs` (SHA-256 bank, current values) in the TPM behind `tcti`.
pub fn seal_key(tcti: &str, key: &ModelKey, pcrs: &[u8]) -> Result<TpmSealedKey, TpmSealError> {
    if pcrs.is_empty() {
        return Err(TpmSealError::Tpm {
            what: "PCR selection".into(),
            cause: "no PCR selected: the key would unseal in any boot state".into(),
        });
    }
    let mut ctx = open(tcti)?;
    let values = read_pcrs(&mut ctx, pcrs)?;
    let trial = pcr_policy_session(&mut ctx, SessionType::Trial, pcrs)?;
    let digest = PolicySession::try_from(trial)
        .map_err(tss("policy session"))
        .and_then(|p| {
            ctx.policy_get_digest(p)
                .map_err(tss("TPM2_PolicyGetDigest"))
        });
    flush(&mut ctx, SessionHandle::from(trial).into());
    let digest = digest?;
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_no_da(true)
        .build()
        .map_err(tss("data object attributes"))?;
    let public = PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::KeyedHash)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_auth_policy(digest.clone())
        .with_keyed_hash_parameters(PublicKeyedHashParameters::new(KeyedHashScheme::Null))
        .with_keyed_hash_unique_identifier(Digest::default())
        .build()
        .map_err(tss("data object template"))?;
    let sensitive =
        SensitiveData::try_from(key.expose().to_vec()).map_err(tss("the sealed data"))?;
    let parent = parent(&mut ctx)?;
    let created = ctx.execute_with_nullauth_session(|c| {
        c.create(parent, public, None, Some(sensitive), None, None)
    });
    flush(&mut ctx, parent.into());
    let created = created.map_err(tss("TPM2_Create"))?;
    let public = created
        .out_public
        .marshall()
        .map_err(tss("marshalling the public area"))?;
    Ok(TpmSealedKey {
        format: BLOB_FORMAT.to_owned(),
        version: BLOB_VERSION,
        key_id: key.id(),
        pcrs: values,
        policy_digest: hex::encode(digest.value()),
        public: B64.encode(public),
        private: B64.encode(created.out_private.value()),
    })
}

/// Unseals the model key of `blob` from the TPM behind `tcti`; refuses when the PCRs differ
/// from those it was sealed to, or the key does not have the blob's id.
pub fn unseal_key(tcti: &str, blob: &TpmSealedKey) -> Result<ModelKey, TpmSealError> {
    let bad = |reason: String| TpmSealError::Blob {
        path: "blob".into(),
        reason,
    };
    let public_bytes = B64
        .decode(&blob.public)
        .map_err(|e| bad(format!("public: {e}")))?;
    let public = Public::unmarshall(&public_bytes).map_err(|e| bad(format!("public: {e}")))?;
    let private = B64
        .decode(&blob.private)
        .map_err(|e| bad(format!("private: {e}")))
        .and_then(|p| Private::try_from(p).map_err(|e| bad(format!("private: {e}"))))?;
    let pcrs: Vec<u8> = blob.pcrs.iter().map(|p| p.index).collect();
    let mut ctx = open(tcti)?;
    // A clear refusal before asking the TPM (which enforces the policy in any case: these
    // recorded values are for the message only).
    let changed = changed_pcrs(&blob.pcrs, &read_pcrs(&mut ctx, &pcrs)?);
    if !changed.is_empty() {
        return Err(TpmSealError::PcrMismatch { changed });
    }
    let parent = parent(&mut ctx)?;
    let loaded = ctx.execute_with_nullauth_session(|c| c.load(parent, private, public));
    flush(&mut ctx, parent.into());
    let object = loaded.map_err(tss("TPM2_Load (a blob sealed by another TPM?)"))?;
    let session = pcr_policy_session(&mut ctx, SessionType::Policy, &pcrs);
    let unsealed = session.and_then(|session| {
        let out = ctx
            .execute_with_session(Some(session), |c| c.unseal(object.into()))
            .map_err(tss("TPM2_Unseal"));
        flush(&mut ctx, SessionHandle::from(session).into());
        out
    });
    flush(&mut ctx, object.into());
    let data = match unsealed {
        Ok(data) => Zeroizing::new(data.value().to_vec()),
        Err(err) => {
            // Name the PCRs that moved, when that is why.
            let changed = changed_pcrs(&blob.pcrs, &read_pcrs(&mut ctx, &pcrs).unwrap_or_default());
            return Err(if changed.is_empty() {
                err
            } else {
                TpmSealError::PcrMismatch { changed }
            });
        }
    };
    let bytes = <[u8; KEY_LEN]>::try_from(data.as_slice())
        .map_err(|_| bad(format!("unsealed {} bytes, expected {KEY_LEN}", data.len())))?;
    let key = ModelKey::from_bytes(bytes);
    if key.id() != blob.key_id {
        return Err(bad(format!(
            "the unsealed key has id {}, the blob says {}",
            key.id(),
            blob.key_id
        )));
    }
    Ok(key)
}

/// The indices (comma-separated) of the PCRs in `then` whose value is not in `now`.
fn changed_pcrs(then: &[SealedPcr], now: &[SealedPcr]) -> String {
    then.iter()
        .filter(|pcr| !now.contains(pcr))
        .map(|pcr| pcr.index.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl TpmSealedKey {
    /// Writes the blob to `path` (mode 0600, never overwriting).
    pub fn write(&self, path: &Path) -> Result<(), TpmSealError> {
        super::write_json_blob(path, self).map_err(|reason| TpmSealError::Blob {
            path: path.display().to_string(),
            reason,
        })
    }

    /// Reads and checks a blob file.
    pub fn read(path: &Path) -> Result<Self, TpmSealError> {
        let fail = |reason: String| TpmSealError::Blob {
            path: path.display().to_string(),
            reason,
        };
        let blob: Self = super::read_json_blob(path, BLOB_FORMAT, BLOB_VERSION, |b: &Self| {
            (b.format.as_str(), b.version)
        })
        .map_err(fail)?;
        if blob.pcrs.is_empty() {
            return Err(fail(
                "no PCRs: refusing a key bound to no boot state".into(),
            ));
        }
        Ok(blob)
    }
}

/// Parses a PCR list such as `0,1,2,7` or `0-7`.
pub fn parse_pcrs(text: &str) -> Result<Vec<u8>, String> {
    let mut pcrs = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (low, high) = part.split_once('-').unwrap_or((part, part));
        let parse = |s: &str| {
            s.trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p < 24)
                .ok_or_else(|| format!("{s:?} is not a PCR index (0..=23)"))
        };
        let (low, high) = (parse(low)?, parse(high)?);
        if low > high {
            return Err(format!("{part:?}: empty range"));
        }
        pcrs.extend(low..=high);
    }
    pcrs.sort_unstable();
    pcrs.dedup();
    if pcrs.is_empty() {
        return Err("no PCR given".into());
    }
    Ok(pcrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcr_lists_parse() {
        assert_eq!(parse_pcrs("0-3,7").unwrap(), vec![0, 1, 2, 3, 7]);
        assert_eq!(parse_pcrs("16, 7,7").unwrap(), vec![7, 16]);
        assert!(parse_pcrs("24").is_err());
        assert!(parse_pcrs("5-2").is_err());
        assert!(parse_pcrs("").is_err());
    }
}
