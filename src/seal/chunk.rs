//! One sealed file's chunks: its key, the nonce and associated data of each chunk.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};

use super::key::ModelKey;

/// Length of the GCM tag that follows each chunk's ciphertext.
pub const TAG_LEN: usize = 16;
/// Domain separation of the per-file key and of the associated data.
const LABEL: &[u8] = b"inferno-seal-v1";

/// The AES-256-GCM key of one file of one sealing, with the data every chunk's AAD binds.
pub struct FileCipher {
    key: LessSafeKey,
    header_digest: [u8; 32],
    name: String,
}

impl FileCipher {
    /// The key of file `name`: HKDF-SHA256(salt = the manifest's salt, IKM = the model key,
    /// info = "inferno-seal-v1" ‖ 0x00 ‖ name) expanded to 32 bytes.
    pub fn new(model_key: &ModelKey, salt: &[u8; 32], header_digest: [u8; 32], name: &str) -> Self {
        let info = [LABEL, b"\0", name.as_bytes()];
        let prk = Salt::new(HKDF_SHA256, salt).extract(model_key.expose());
        let okm = prk
            .expand(&info, &AES_256_GCM)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        Self {
            key: LessSafeKey::new(UnboundKey::from(okm)),
            header_digest,
            name: name.to_owned(),
        }
    }

    /// The nonce of chunk `index`: four zero bytes, then the index as a big-endian u64.
    fn nonce(index: u64) -> Nonce {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[4..].copy_from_slice(&index.to_be_bytes());
        Nonce::assume_unique_for_key(nonce)
    }

    /// The associated data of chunk `index`: "inferno-seal-v1" ‖ header digest (32 bytes) ‖
    /// index (u64 big-endian) ‖ last (one byte, 1 or 0) ‖ file name (UTF-8).
    fn aad(&self, index: u64, last: bool) -> Vec<u8> {
        let mut aad = Vec::with_capacity(LABEL.len() + 32 + 9 + self.name.len());
        aad.extend_from_slice(LABEL);
        aad.extend_from_slice(&self.header_digest);
        aad.extend_from_slice(&index.to_be_bytes());
        aad.push(u8::from(last));
        aad.extend_from_slice(self.name.as_bytes());
        aad
    }

    /// Encrypts chunk `index` in place and returns its tag.
    pub fn seal(&self, index: u64, last: bool, in_out: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Self::nonce(index),
                Aad::from(self.aad(index, last)),
                in_out,
            )
            .expect("a chunk is far below AES-GCM's length limit");
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Decrypts chunk `index` in place; `false` (and unspecified contents) when it does not
    /// authenticate.
    pub fn open(&self, index: u64, last: bool, in_out: &mut [u8], tag: &[u8; TAG_LEN]) -> bool {
        let tag = Tag::from(*tag);
        self.key
            .open_in_place_separate_tag(
                Self::nonce(index),
                Aad::from(self.aad(index, last)),
                tag,
                in_out,
                0..,
            )
            .is_ok()
    }
}

/// The number of chunks of a file of `size` bytes: at least one (an empty file has one empty
/// chunk, so that its last-chunk flag is authenticated too).
pub fn chunk_count(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size).max(1)
}

/// The length of the sealed file of a `size`-byte plaintext.
pub fn sealed_len(size: u64, chunk_size: u64) -> u64 {
    size + chunk_count(size, chunk_size) * TAG_LEN as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cipher(name: &str, header: u8) -> FileCipher {
        FileCipher::new(&ModelKey::from_bytes([1; 32]), &[2; 32], [header; 32], name)
    }

    #[test]
    fn chunks_open_only_with_their_own_index_flag_file_and_header() {
        let a = cipher("a", 0);
        let mut chunk = b"hello".to_vec();
        let tag = a.seal(3, false, &mut chunk);
        let sealed = chunk.clone();
        assert!(a.open(3, false, &mut chunk, &tag));
        assert_eq!(chunk, b"hello");
        for (c, index, last) in [
            (cipher("a", 0), 4, false),
            (cipher("a", 0), 3, true),
            (cipher("b", 0), 3, false),
            (cipher("a", 1), 3, false),
        ] {
            let mut chunk = sealed.clone();
            assert!(!c.open(index, last, &mut chunk, &tag));
        }
        let mut flipped = sealed.clone();
        flipped[0] ^= 1;
        assert!(!a.open(3, false, &mut flipped, &tag));
    }

    #[test]
    fn chunk_counts() {
        assert_eq!(chunk_count(0, 10), 1);
        assert_eq!(chunk_count(10, 10), 1);
        assert_eq!(chunk_count(11, 10), 2);
        assert_eq!(sealed_len(11, 10), 11 + 32);
    }
}
