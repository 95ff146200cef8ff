//! The model key: 32 random bytes, zeroized when dropped; key files (mode 0600) and key ids.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ring::rand::{SecureRandom, SystemRandom};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::error::SealError;

/// Length of a model key.
pub const KEY_LEN: usize = 32;
/// Domain separation of the key id.
const KEY_ID_LABEL: &[u8] = b"inferno-seal-v1 key-id";

/// A 256-bit model key. Never printed, zeroized when dropped.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct ModelKey([u8; KEY_LEN]);

impl std::fmt::Debug for ModelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelKey(id {})", self.id())
    }
}

impl ModelKey {
    /// A fresh random key.
    pub fn generate() -> Result<Self, SealError> {
        let mut key = [0u8; KEY_LEN];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| SealError::Wrap("the system random generator failed".into()))?;
        Ok(Self(key))
    }

    /// The key from raw bytes (zeroize the caller's copy).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The raw key (for deriving file keys and for wrapping).
    pub(crate) fn expose(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The public key id: the first 16 bytes of SHA-256("inferno-seal-v1 key-id" ‖ key), hex.
    pub fn id(&self) -> String {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(KEY_ID_LABEL);
        ctx.update(&self.0);
        hex::encode(&ctx.finish().as_ref()[..16])
    }

    /// Reads a key file: exactly 32 raw bytes, not readable by group or others.
    pub fn read_file(path: &Path) -> Result<Self, SealError> {
        let bad = |reason: String| SealError::KeyFile {
            path: path.to_path_buf(),
            reason,
        };
        let metadata = std::fs::metadata(path).map_err(SealError::io(path))?;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "mode {mode:04o} lets others read it; it must be 0600"
            )));
        }
        let mut bytes = crate::model::files::read_regular(path).map_err(SealError::io(path))?;
        let result = <[u8; KEY_LEN]>::try_from(bytes.as_slice())
            .map(Self)
            .map_err(|_| bad(format!("{} bytes, expected {KEY_LEN}", bytes.len())));
        bytes.zeroize();
        result
    }

    /// Reads `path`, or creates it (mode 0600, never overwriting) with a fresh key when it does
    /// not exist. Returns the key and whether it was created.
    pub fn read_or_create(path: &Path) -> Result<(Self, bool), SealError> {
        if path.exists() {
            return Ok((Self::read_file(path)?, false));
        }
        let key = Self::generate()?;
        super::write_private_file(path, &key.0).map_err(SealError::io(path))?;
        Ok((key, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_is_created_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.key");
        let (key, created) = ModelKey::read_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, created) = ModelKey::read_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(key.id(), again.id());
        assert_eq!(key.id().len(), 32);
    }

    #[test]
    fn key_files_readable_by_others_or_of_the_wrong_length_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, [7u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ModelKey::read_file(&path).unwrap_err().to_string();
        assert!(err.contains("must be 0600"), "{err}");
        std::fs::write(&path, [7u8; 31]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = ModelKey::read_file(&path).unwrap_err().to_string();
        assert!(err.contains("31 bytes"), "{err}");
    }
}
