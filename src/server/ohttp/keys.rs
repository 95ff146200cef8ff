//! The gateway's key configuration (RFC 9458 §3): one X25519 key pair generated in memory at
//! start-up and never written anywhere, offered with HKDF-SHA256 and either AES-128-GCM or
//! ChaCha20-Poly1305. The SHA-256 of its encoding is bound into the runtime data, so evidence
//! names the key that requests are sealed to.

use ohttp::hpke::{Aead, Kdf, Kem};
use ohttp::{KeyConfig, SymmetricSuite};
use sha2::{Digest, Sha256};

/// The length of an X25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;

/// The key configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[error("the Oblivious HTTP key configuration could not be made: {0}")]
pub struct KeyConfigError(#[from] ohttp::Error);

/// The gateway's key pair and its encodings.
pub struct GatewayKey {
    server: ohttp::Server,
    encoded: Vec<u8>,
    list: Vec<u8>,
}

impl GatewayKey {
    /// A fresh key pair under a random key identifier.
    pub fn generate() -> Result<Self, KeyConfigError> {
        let config = KeyConfig::new(
            rand::random::<u8>(),
            Kem::X25519Sha256,
            vec![
                SymmetricSuite::new(Kdf::HkdfSha256, Aead::Aes128Gcm),
                SymmetricSuite::new(Kdf::HkdfSha256, Aead::ChaCha20Poly1305),
            ],
        )?;
        let encoded = config.encode()?;
        let list = KeyConfig::encode_list(&[&config])?;
        Ok(Self {
            server: ohttp::Server::new(config)?,
            encoded,
            list,
        })
    }

    /// The key identifier (the first byte of the encoded configuration).
    pub fn key_id(&self) -> u8 {
        self.encoded[0]
    }

    /// The X25519 public key (after the key identifier and the two-byte KEM identifier).
    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        let mut key = [0; PUBLIC_KEY_LEN];
        key.copy_from_slice(&self.encoded[3..3 + PUBLIC_KEY_LEN]);
        key
    }

    /// The encoded key configuration (RFC 9458 §3.1).
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// The `application/ohttp-keys` document: the configuration with its two-byte length.
    pub fn list(&self) -> &[u8] {
        &self.list
    }

    /// SHA-256 of [`GatewayKey::encoded`]: the runtime data's `ohttp_key_config_sha256`.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(&self.encoded).into()
    }

    /// The decapsulating side.
    pub fn server(&self) -> &ohttp::Server {
        &self.server
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_offers_x25519_with_both_aeads() {
        let key = GatewayKey::generate().unwrap();
        let encoded = key.encoded();
        // key id, KEM 0x0020, 32-byte key, 8 bytes of suites: (1, 1) and (1, 3).
        assert_eq!(encoded.len(), 1 + 2 + 32 + 2 + 8);
        assert_eq!(&encoded[1..3], &[0x00, 0x20]);
        assert_eq!(&encoded[35..], &[0, 8, 0, 1, 0, 1, 0, 1, 0, 3]);
        assert_eq!(key.public_key(), encoded[3..35]);
        assert_eq!(key.list()[..2], (encoded.len() as u16).to_be_bytes());
        assert_eq!(&key.list()[2..], encoded);
        assert_ne!(
            GatewayKey::generate().unwrap().public_key(),
            key.public_key()
        );
    }
}
