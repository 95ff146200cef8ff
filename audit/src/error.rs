//! Errors of the audit log.

use crate::note::NoteError;

/// An audit log error.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the file.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The log is damaged somewhere other than an unacknowledged tail (a hard fault).
    #[error("audit log is corrupt at {location}: {reason}")]
    Corrupt {
        /// Where (file and byte offset).
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// The writer hit an error earlier and refuses all appends (fail closed).
    #[error("audit log has failed and accepts no more records: {0}")]
    Failed(String),
    /// The log is not consistent with the configured witness checkpoint.
    #[error("audit log refuses to open: {0}")]
    Witness(String),
    /// Another writer holds the log directory's lock, or it cannot be taken.
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    /// The writer has shut down.
    #[error("audit log is closed")]
    Closed,
    /// A checkpoint or key is malformed or does not verify.
    #[error(transparent)]
    Note(#[from] NoteError),
    /// The configuration is invalid.
    #[error("audit configuration: {0}")]
    Config(String),
    /// A record could not be encoded.
    #[error("cannot encode audit record: {0}")]
    Encode(#[from] serde_json::Error),
}

impl AuditError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
