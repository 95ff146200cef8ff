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
pub use open::open_sealed;
pub use write::{SealOptions, seal_dir};

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
