//! Inferno's append-only, tamper-evident audit log.
//!
//! Records (API requests, their completions and security events) are framed with chained
//! CRC32C into segment files, form the leaves of an RFC 9162 Merkle tree ([`merkle`]) and are
//! covered by Ed25519-signed C2SP checkpoints ([`note`]). A dedicated writer thread commits
//! appends in groups with fsync ([`AuditLog`]); opening a log repairs a torn tail; a directory
//! lock keeps a second writer or a prune away from an open log; [`verify`] checks a log
//! offline; [`add_checkpoint`] is a witness that countersigns a checkpoint only when it extends
//! the last one it saw. `docs/audit-log.md` specifies the on-disk format.
//!
//! The crate depends on no part of the server: a compliance laptop builds the verifier alone.
//! Its modules are private; this root re-exports the supported API, and [`merkle`] and [`note`]
//! hold the two standard formats it implements (RFC 9162 proofs, C2SP signed notes).

mod config;
mod content;
mod error;
mod fileops;
mod frame;
mod lock;
pub mod merkle;
pub mod note;
mod proof_file;
mod prune;
mod read;
mod record;
mod recovery;
mod scan;
mod segment;
mod sink;
mod verify;
mod witness;
mod writer;

pub use config::AuditConfig;
pub use content::{
    ContentError, ContentMode, ContentPolicy, SealedContent, key_file_exposure, read_key_file,
};
pub use error::AuditError;
pub use fileops::{AppendFile, FileOps, StdFileOps};
pub use lock::{LOCK_FILE, LockError};
pub use proof_file::{ConsistencyProof, InclusionProof, ProofFileError};
pub use prune::{PruneError, PruneOutcome, prune};
pub use read::{StoredRecord, load_tree, read_records, stored_checkpoints};
pub use record::{
    CompletionRecord, ConstraintNote, EvidenceBlob, RECORD_VERSION, Record, RecordBody,
    RequestRecord, SecurityEvent,
};
pub use recovery::newest_record_time;
pub use scan::{CHECKPOINTS_FILE, Location};
pub use sink::{AuditSink, CompletionFacts, RequestFacts};
pub use verify::{Report, StartEvent, VerifyOptions, Violation, verify};
pub use witness::{WitnessError, WitnessState, add_checkpoint, check_add, load_state, store_state};
pub use writer::{Appended, AuditLog, StartInfo};
