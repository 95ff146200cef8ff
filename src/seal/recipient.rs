//! Wrapping the model key to a key broker (`inferno seal --recipient`): HPKE (RFC 9180) base
//! mode with DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and AES-256-GCM, by the `hpke` crate.
//!
//! The info string is [`WRAP_INFO`]; the associated data is the model key's id, so a wrapped key
//! cannot be passed off under another id.

use std::path::Path;

use hpke::aead::AesGcm256;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use zeroize::{Zeroize, Zeroizing};

use super::error::SealError;
use super::key::{KEY_LEN, ModelKey};
use super::manifest::{WrappedKey, check_hex};

/// The suite name recorded in the manifest.
pub const SUITE: &str = "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM";
/// HPKE `info` of a wrapped model key.
pub const WRAP_INFO: &[u8] = b"inferno-seal-v1 model-key";

/// A key broker's X25519 public key.
#[derive(Clone)]
pub struct RecipientKey(<X25519HkdfSha256 as Kem>::PublicKey);

impl RecipientKey {
    /// Parses 32 bytes of hex (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self, String> {
        let text = text.trim();
        check_hex("public key", text, 32)?;
        let bytes = hex::decode(text).map_err(|e| e.to_string())?;
        <X25519HkdfSha256 as Kem>::PublicKey::from_bytes(&bytes)
            .map(Self)
            .map_err(|e| format!("not an X25519 public key: {e}"))
    }

    /// Reads a public key file (hex, as `inferno keybroker` writes it).
    pub fn read_file(path: &Path) -> Result<Self, SealError> {
        let text = std::fs::read_to_string(path).map_err(SealError::io(path))?;
        Self::from_hex(&text).map_err(|reason| SealError::KeyFile {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// The key as hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0.to_bytes())
    }
}

/// The private half of a recipient key pair, zeroized when dropped.
pub struct RecipientSecret(<X25519HkdfSha256 as Kem>::PrivateKey);

impl RecipientSecret {
    /// A fresh key pair.
    pub fn generate() -> (Self, RecipientKey) {
        let (secret, public) = X25519HkdfSha256::gen_keypair(&mut rand::rng());
        (Self(secret), RecipientKey(public))
    }

    /// The secret from its 32 raw bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        <X25519HkdfSha256 as Kem>::PrivateKey::from_bytes(bytes)
            .map(Self)
            .map_err(|e| format!("not an X25519 private key: {e}"))
    }

    /// The raw secret (to store in a 0600 file).
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(self.0.to_bytes().to_vec())
    }

    /// The matching public key.
    pub fn public(&self) -> RecipientKey {
        RecipientKey(X25519HkdfSha256::sk_to_pk(&self.0))
    }
}

/// Wraps `key` to `recipient` (the manifest's `wrapped_key`).
pub fn wrap(key: &ModelKey, recipient: &RecipientKey) -> Result<WrappedKey, SealError> {
    wrap_with_info(key, recipient, WRAP_INFO)
}

/// Wraps `key` to `recipient` under the HPKE `info` string `info` (associated data: the key id).
pub fn wrap_with_info(
    key: &ModelKey,
    recipient: &RecipientKey,
    info: &[u8],
) -> Result<WrappedKey, SealError> {
    let (enc, ciphertext) = hpke::single_shot_seal::<AesGcm256, HkdfSha256, X25519HkdfSha256, _>(
        &OpModeS::Base,
        &recipient.0,
        info,
        key.expose(),
        key.id().as_bytes(),
        &mut rand::rng(),
    )
    .map_err(|e| SealError::Wrap(e.to_string()))?;
    Ok(WrappedKey {
        suite: SUITE.to_owned(),
        recipient: recipient.to_hex(),
        enc: hex::encode(enc.to_bytes()),
        ciphertext: hex::encode(ciphertext),
    })
}

/// Unwraps a manifest's model key with the recipient's secret and checks it has id `key_id`.
pub fn unwrap(
    wrapped: &WrappedKey,
    secret: &RecipientSecret,
    key_id: &str,
) -> Result<ModelKey, SealError> {
    unwrap_with_info(wrapped, secret, key_id, WRAP_INFO)
}

/// Unwraps a model key wrapped under the HPKE `info` string `info` and checks it has id
/// `key_id`.
pub fn unwrap_with_info(
    wrapped: &WrappedKey,
    secret: &RecipientSecret,
    key_id: &str,
    info: &[u8],
) -> Result<ModelKey, SealError> {
    let fail = |reason: String| SealError::Wrap(reason);
    check_wrapped(wrapped).map_err(fail)?;
    let enc_bytes = hex::decode(&wrapped.enc).map_err(|e| fail(e.to_string()))?;
    let enc = <X25519HkdfSha256 as Kem>::EncappedKey::from_bytes(&enc_bytes)
        .map_err(|e| fail(e.to_string()))?;
    let ciphertext = hex::decode(&wrapped.ciphertext).map_err(|e| fail(e.to_string()))?;
    let plain = Zeroizing::new(
        hpke::single_shot_open::<AesGcm256, HkdfSha256, X25519HkdfSha256>(
            &OpModeR::Base,
            &secret.0,
            &enc,
            info,
            &ciphertext,
            key_id.as_bytes(),
        )
        .map_err(|_| fail("the wrapped key does not open with this recipient's key".into()))?,
    );
    let mut bytes = [0u8; KEY_LEN];
    if plain.len() != KEY_LEN {
        return Err(fail(format!("unwrapped {} bytes", plain.len())));
    }
    bytes.copy_from_slice(&plain);
    let key = ModelKey::from_bytes(bytes);
    bytes.zeroize();
    if key.id() != key_id {
        return Err(fail(
            "the unwrapped key does not have the manifest's key id".into(),
        ));
    }
    Ok(key)
}

/// Structural checks of a manifest's `wrapped_key`.
pub(crate) fn check_wrapped(wrapped: &WrappedKey) -> Result<(), String> {
    if wrapped.suite != SUITE {
        return Err(format!(
            "wrapped_key.suite: unsupported `{}`",
            wrapped.suite
        ));
    }
    check_hex("wrapped_key.recipient", &wrapped.recipient, 32)?;
    check_hex("wrapped_key.enc", &wrapped.enc, 32)?;
    check_hex("wrapped_key.ciphertext", &wrapped.ciphertext, KEY_LEN + 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_key_opens_only_for_its_recipient_and_id() {
        let key = ModelKey::from_bytes([9; 32]);
        let (secret, public) = RecipientSecret::generate();
        let wrapped = wrap(&key, &public).unwrap();
        check_wrapped(&wrapped).unwrap();
        assert_eq!(unwrap(&wrapped, &secret, &key.id()).unwrap().id(), key.id());

        let (other, _) = RecipientSecret::generate();
        assert!(unwrap(&wrapped, &other, &key.id()).is_err());
        assert!(unwrap(&wrapped, &secret, &"00".repeat(16)).is_err());
        // A key wrapped under another info string does not open as a manifest key.
        let released = wrap_with_info(&key, &public, b"other purpose").unwrap();
        assert!(unwrap(&released, &secret, &key.id()).is_err());
        let opened = unwrap_with_info(&released, &secret, &key.id(), b"other purpose").unwrap();
        assert_eq!(opened.id(), key.id());
        let round = RecipientSecret::from_bytes(&secret.to_bytes()).unwrap();
        assert_eq!(round.public().to_hex(), public.to_hex());
        assert_eq!(
            RecipientKey::from_hex(&public.to_hex()).unwrap().to_hex(),
            public.to_hex()
        );
    }
}
