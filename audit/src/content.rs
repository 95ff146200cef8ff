//! The content policy: what a record keeps of prompts and completions.
//!
//! - `none` (the default): nothing;
//! - `hmac`: `HMAC-SHA256(key, label || 0x00 || request_id || 0x00 || text)`, so a holder of the
//!   key can test whether a given text was sent, and nobody else learns anything;
//! - `encrypted`: AES-256-GCM of the text under a configured key, with a random 96-bit nonce
//!   and `label || 0x00 || request_id` as associated data. Only these content fields are
//!   encrypted; the rest of the record stays readable for verification.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom as _, SystemRandom};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// Which content the log keeps (the server policy's `[audit] content`: `none`, `hmac`,
/// `encrypted`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentMode {
    /// Nothing: records carry metadata only.
    #[default]
    None,
    /// An HMAC-SHA256 of each text under a key the compliance team holds.
    Hmac,
    /// The full texts, encrypted (AES-256-GCM) under a key the compliance team holds.
    Encrypted,
}

impl ContentMode {
    /// The policy's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Hmac => "hmac",
            Self::Encrypted => "encrypted",
        }
    }

    /// Whether the mode needs a content key.
    pub fn needs_key(self) -> bool {
        self != Self::None
    }
}

/// A content field as stored in a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum SealedContent {
    /// Nothing kept.
    None,
    /// A keyed hash of the text.
    Hmac {
        /// Hex HMAC-SHA256.
        hmac: String,
    },
    /// The encrypted text.
    Encrypted {
        /// Base64 of the 12-byte nonce.
        nonce: String,
        /// Base64 of the AES-256-GCM ciphertext and tag.
        ciphertext: String,
    },
}

/// A content policy error.
#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    /// The key file could not be read.
    #[error("cannot read content key file {path}: {source}")]
    KeyFile {
        /// The key file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The key file does not hold a 32-byte key.
    #[error("content key file {0} must hold exactly 32 bytes (raw or 64 hex digits)")]
    KeyLength(String),
    /// The mode needs a key and none was configured.
    #[error(
        "the policy's audit content mode `{0}` needs a key: set [audit] content_key_file in the configuration"
    )]
    MissingKey(&'static str),
    /// Encryption or random generation failed.
    #[error("content encryption failed")]
    Crypto,
    /// Decryption failed (wrong key, or the record was altered).
    #[error("content decryption failed (wrong key or altered record)")]
    Decrypt,
}

/// The permission bits of a key file when its group or other users may access it (anything
/// beyond 0600/0400), or `None` when only its owner may.
pub fn key_file_exposure(path: &Path) -> Result<Option<u32>, ContentError> {
    use std::os::unix::fs::PermissionsExt as _;
    let metadata = std::fs::metadata(path).map_err(|source| ContentError::KeyFile {
        path: path.display().to_string(),
        source,
    })?;
    let mode = metadata.permissions().mode() & 0o777;
    Ok((mode & 0o077 != 0).then_some(mode))
}

/// Reads a 32-byte key from a file holding the raw bytes or 64 hex digits.
pub fn read_key_file(path: &Path) -> Result<Zeroizing<[u8; 32]>, ContentError> {
    let raw = Zeroizing::new(std::fs::read(path).map_err(|source| ContentError::KeyFile {
        path: path.display().to_string(),
        source,
    })?);
    let mut key = Zeroizing::new([0u8; 32]);
    let trimmed = raw.trim_ascii();
    if trimmed.len() == 64 && hex::decode_to_slice(trimmed, &mut key[..]).is_ok() {
        return Ok(key);
    }
    if raw.len() == 32 {
        key.copy_from_slice(&raw);
        return Ok(key);
    }
    Err(ContentError::KeyLength(path.display().to_string()))
}

enum Sealer {
    None,
    Hmac(Box<hmac::Key>),
    Encrypt(Box<LessSafeKey>),
}

/// Seals prompt and completion text as the configured policy says.
pub struct ContentPolicy {
    mode: ContentMode,
    sealer: Sealer,
    rng: SystemRandom,
}

impl std::fmt::Debug for ContentPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentPolicy")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn label_aad(label: &str, request_id: &str) -> Vec<u8> {
    let mut aad = label.as_bytes().to_vec();
    aad.push(0);
    aad.extend_from_slice(request_id.as_bytes());
    aad
}

impl ContentPolicy {
    /// A policy that keeps nothing.
    pub fn none() -> Self {
        Self {
            mode: ContentMode::None,
            sealer: Sealer::None,
            rng: SystemRandom::new(),
        }
    }

    /// Builds the policy for `mode` from a 32-byte key (ignored for `none`).
    pub fn new(mode: ContentMode, key: Option<&[u8; 32]>) -> Result<Self, ContentError> {
        let sealer = match (mode, key) {
            (ContentMode::None, _) => Sealer::None,
            (ContentMode::Hmac, Some(k)) => {
                Sealer::Hmac(Box::new(hmac::Key::new(hmac::HMAC_SHA256, k)))
            }
            (ContentMode::Encrypted, Some(k)) => Sealer::Encrypt(Box::new(LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, k).map_err(|_| ContentError::Crypto)?,
            ))),
            (m, None) => return Err(ContentError::MissingKey(m.as_str())),
        };
        Ok(Self {
            mode,
            sealer,
            rng: SystemRandom::new(),
        })
    }

    /// The configured mode.
    pub fn mode(&self) -> ContentMode {
        self.mode
    }

    /// Seals `text`, labelled `prompt` or `completion`, for request `request_id`.
    pub fn seal(
        &self,
        label: &str,
        request_id: &str,
        text: &str,
    ) -> Result<SealedContent, ContentError> {
        let aad = label_aad(label, request_id);
        match &self.sealer {
            Sealer::None => Ok(SealedContent::None),
            Sealer::Hmac(key) => {
                let mut ctx = hmac::Context::with_key(key);
                ctx.update(&aad);
                ctx.update(&[0]);
                ctx.update(text.as_bytes());
                Ok(SealedContent::Hmac {
                    hmac: hex::encode(ctx.sign().as_ref()),
                })
            }
            Sealer::Encrypt(key) => {
                let mut nonce = [0u8; NONCE_LEN];
                self.rng
                    .fill(&mut nonce)
                    .map_err(|_| ContentError::Crypto)?;
                let mut buf = text.as_bytes().to_vec();
                key.seal_in_place_append_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(&aad),
                    &mut buf,
                )
                .map_err(|_| ContentError::Crypto)?;
                Ok(SealedContent::Encrypted {
                    nonce: B64.encode(nonce),
                    ciphertext: B64.encode(buf),
                })
            }
        }
    }

    /// Decrypts an encrypted content field (for compliance readers holding the key).
    pub fn open(
        &self,
        label: &str,
        request_id: &str,
        content: &SealedContent,
    ) -> Result<Option<Zeroizing<String>>, ContentError> {
        let (Sealer::Encrypt(key), SealedContent::Encrypted { nonce, ciphertext }) =
            (&self.sealer, content)
        else {
            return Ok(None);
        };
        let nonce: [u8; NONCE_LEN] = B64
            .decode(nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or(ContentError::Decrypt)?;
        let mut buf = Zeroizing::new(B64.decode(ciphertext).map_err(|_| ContentError::Decrypt)?);
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(label_aad(label, request_id)),
                &mut buf,
            )
            .map_err(|_| ContentError::Decrypt)?;
        let text = String::from_utf8(plain.to_vec()).map_err(|_| ContentError::Decrypt)?;
        Ok(Some(Zeroizing::new(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_open_to_group_or_others_are_reported() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("content.key");
        std::fs::write(&path, [1u8; 32]).expect("write");
        for (mode, exposed) in [
            (0o600, None),
            (0o400, None),
            (0o640, Some(0o640)),
            (0o604, Some(0o604)),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert_eq!(
                key_file_exposure(&path).expect("metadata"),
                exposed,
                "{mode:o}"
            );
        }
        assert!(key_file_exposure(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn hmac_is_keyed_and_bound_to_request() {
        let p = ContentPolicy::new(ContentMode::Hmac, Some(&[1; 32])).expect("policy");
        let a = p.seal("prompt", "r1", "hello").expect("seal");
        assert_eq!(a, p.seal("prompt", "r1", "hello").expect("seal"));
        assert_ne!(a, p.seal("prompt", "r2", "hello").expect("seal"));
        let q = ContentPolicy::new(ContentMode::Hmac, Some(&[2; 32])).expect("policy");
        assert_ne!(a, q.seal("prompt", "r1", "hello").expect("seal"));
    }

    #[test]
    fn encryption_round_trips_and_detects_swaps() {
        let p = ContentPolicy::new(ContentMode::Encrypted, Some(&[9; 32])).expect("policy");
        let sealed = p.seal("prompt", "r1", "secret prompt").expect("seal");
        let SealedContent::Encrypted { ciphertext, .. } = &sealed else {
            panic!("expected ciphertext");
        };
        assert!(!ciphertext.contains("secret"));
        let plain = p
            .open("prompt", "r1", &sealed)
            .expect("opens")
            .expect("some");
        assert_eq!(plain.as_str(), "secret prompt");
        assert!(p.open("prompt", "r2", &sealed).is_err());
        assert!(p.open("completion", "r1", &sealed).is_err());
    }
}
