//! The append-only, tamper-evident audit log.
//!
//! Records (API requests, their completions and security events) are framed with chained
//! CRC32C into segment files ([`segment`], [`frame`]), form the leaves of an RFC 9162 Merkle
//! tree ([`merkle`]) and are covered by Ed25519-signed C2SP checkpoints ([`note`]). A dedicated
//! writer thread commits appends in groups with fsync ([`writer`]); [`recovery`] repairs a torn
//! tail at open; [`lock`] keeps a second writer or a prune away from an open log; [`verify`] checks a log offline; [`witness`] countersigns checkpoints only
//! when they extend the last one it saw. `docs/audit-log.md` specifies the on-disk format.

pub mod config;
pub mod content;
pub mod error;
pub mod fileops;
pub mod frame;
pub mod lock;
pub mod merkle;
pub mod note;
pub mod proof_file;
pub mod prune;
pub mod record;
pub mod recovery;
pub mod scan;
pub mod segment;
pub mod sink;
pub mod verify;
pub mod witness;
pub mod witness_http;
pub mod writer;

pub use config::AuditConfig;
pub use content::{ContentMode, ContentPolicy, SealedContent};
pub use error::AuditError;
pub use fileops::{FileOps, StdFileOps};
pub use record::{
    CompletionRecord, ConstraintNote, Record, RecordBody, RequestRecord, SecurityEvent,
};
pub use sink::{AuditSink, CompletionFacts, RequestFacts};
pub use writer::{AuditLog, StartInfo};
