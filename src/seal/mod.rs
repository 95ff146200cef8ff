//! Sealed model weights: every file of a model directory encrypted at rest with chunked
//! AES-256-GCM, opened only with the model key, straight into the memory the loader uses.
//!
//! `docs/sealed-model.md` specifies the format. In short, a sealed directory holds
//! [`MANIFEST_FILE`] (the header: format version, algorithm, chunk size, key id, salt, every
//! plaintext file's size and SHA-256, the model digest, release requirements and, for a key
//! broker, the model key wrapped to the broker's HPKE public key) and one `<name>.sealed` file
//! per plaintext file: its chunks, each AES-256-GCM ciphertext followed by its tag. Each file has
//! its own key (HKDF-SHA256 of the model key, the manifest's random salt and the file name), the
//! nonce of a chunk is its index, and the associated data binds the manifest's digest, the file
//! name, the chunk index and whether the chunk is the last. Truncation, reordering, chunks
//! swapped between files or between sealings, and any changed byte fail authentication.
//!
//! - [`manifest`]: the header, its parser and its checks;
//! - [`key`]: the model key (zeroized), key files (0600) and key ids;
//! - [`chunk`]: per-file keys, nonces, associated data;
//! - [`recipient`]: HPKE (RFC 9180) wrapping of the model key to a key broker;
//! - [`snp`]: the model key wrapped under an SEV-SNP derived key (MSG_KEY_REQ);
//! - [`tpm`]: the model key sealed to the (v)TPM under a PCR policy;
//! - [`write`]: `inferno seal` (streaming, parallel, with a progress bar);
//! - [`open`]: decryption at load, in parallel, with the model digest computed from the
//!   decrypted bytes in the same pass.

pub mod chunk;
pub mod error;
pub mod key;
pub mod manifest;
pub mod open;
pub mod recipient;
pub mod snp;
pub mod tpm;
pub mod write;

pub use error::SealError;
pub use key::ModelKey;
pub use manifest::{MANIFEST_FILE, Manifest, SEALED_SUFFIX};
pub use open::{open_sealed, open_sealed_reporting, open_sealed_streaming};
pub use write::{SealOptions, seal_dir};

/// Creates `path` for writing with exactly `mode`, whatever the umask: never an existing file,
/// and never through a symbolic link (`O_CREAT | O_EXCL | O_NOFOLLOW`), so a link planted at
/// the name makes this fail instead of writing to the link's target.
pub fn create_new_file(path: &std::path::Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(file)
}

/// Creates the directory `dir` (and missing parents) with mode 0700 whatever the umask; an
/// existing directory is kept as it is.
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Creates `path` with mode 0600 (never overwriting an existing file, never through a link),
/// writes `bytes` and syncs them: how every file holding a key or a sealed key blob is written.
pub fn write_private_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    write_new_file(path, bytes, 0o600)
}

/// Creates `path` with exactly `mode` as [`create_new_file`] does, writes `bytes` and syncs them.
pub fn write_new_file(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = create_new_file(path, mode)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Writes a sealed-key blob as pretty JSON with [`write_private_file`] (mode 0600, never
/// overwriting); the error is a reason for the caller's own error type.
fn write_json_blob<T: serde::Serialize>(path: &std::path::Path, blob: &T) -> Result<(), String> {
    let mut bytes = serde_json::to_vec_pretty(blob).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    write_private_file(path, &bytes).map_err(|e| e.to_string())
}

/// Reads a sealed-key blob written by [`write_json_blob`] and checks that `header` (its format
/// name and version) is `format` `version`; the error is a reason for the caller's error type.
fn read_json_blob<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    format: &str,
    version: u32,
    header: impl Fn(&T) -> (&str, u32),
) -> Result<T, String> {
    let bytes = crate::model::files::read_regular(path).map_err(|e| e.to_string())?;
    let blob: T = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let (found_format, found_version) = header(&blob);
    if found_format != format || found_version != version {
        return Err(format!(
            "format {found_format:?} version {found_version}, expected {format:?} version {version}"
        ));
    }
    Ok(blob)
}

/// Whether `dir` holds a sealed model (its manifest exists).
pub fn is_sealed(dir: &std::path::Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

/// Whether a model key file may be used under `profile`: key files are for development only,
/// so the production profile refuses them.
pub fn check_key_file_allowed(
    profile: crate::config::AttestationProfile,
) -> Result<(), &'static str> {
    match profile {
        crate::config::AttestationProfile::Development => Ok(()),
        crate::config::AttestationProfile::Production => Err(
            "key files are for development only; the production profile refuses them (use a key broker)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AttestationProfile;

    #[test]
    fn only_the_development_profile_accepts_key_files() {
        assert!(check_key_file_allowed(AttestationProfile::Development).is_ok());
        let err = check_key_file_allowed(AttestationProfile::Production).unwrap_err();
        assert!(err.contains("production profile refuses"), "{err}");
    }
}
