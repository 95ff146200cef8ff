//! Why sealing or opening a sealed model failed. Every message is one line.

use std::path::PathBuf;

/// Sealing or opening a sealed model failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is malformed or inconsistent.
    #[error("sealed manifest {}: {reason}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A key file is unusable.
    #[error("key file {}: {reason}", path.display())]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The key's id differs from the one the model was sealed with.
    #[error("wrong model key: key id {actual}, the model was sealed with key id {expected}")]
    WrongKey {
        /// The manifest's key id.
        expected: String,
        /// The given key's id.
        actual: String,
    },
    /// A sealed file is shorter or longer than its manifest entry implies.
    #[error("{}: truncated or extended: {actual} bytes, expected {expected}", path.display())]
    Length {
        /// The sealed file.
        path: PathBuf,
        /// The length the manifest implies.
        expected: u64,
        /// The length on disk.
        actual: u64,
    },
    /// A chunk failed authentication: changed, moved, or from another file or sealing.
    #[error("{}: chunk {index} failed authentication (tampered, reordered or swapped)", path.display())]
    Chunk {
        /// The sealed file.
        path: PathBuf,
        /// The chunk's index.
        index: u64,
    },
    /// A decrypted file or the model does not have the digest the manifest promises.
    #[error("model digest mismatch: {what}: expected {expected}, got {actual}")]
    Digest {
        /// What was compared.
        what: String,
        /// The expected hex digest.
        expected: String,
        /// The computed hex digest.
        actual: String,
    },
    /// The model directory to seal is unusable.
    #[error("{0}")]
    Model(#[from] crate::model::ModelError),
    /// HPKE wrapping or unwrapping of the model key failed.
    #[error("model key wrapping: {0}")]
    Wrap(String),
    /// The output already exists.
    #[error("{}: already exists (refusing to overwrite)", path.display())]
    Exists {
        /// The existing path.
        path: PathBuf,
    },
}

impl SealError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
