//! The `[audit]` table of the configuration file: operational settings only (where, how large,
//! how often, which key file). What the log keeps of prompts and completions is decided by the
//! server policy.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Audit log settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// The log directory.
    pub dir: PathBuf,
    /// Write a checkpoint after this many records (0: only on the timer and at shutdown).
    pub checkpoint_every_records: u64,
    /// Write a checkpoint after this many seconds if records were added (0: never on a timer).
    pub checkpoint_every_seconds: u64,
    /// Start a new segment file once the current one reaches this many bytes.
    pub segment_max_bytes: u64,
    /// Under load, write a group (and fsync it, if a caller waits) no sooner than this many
    /// milliseconds after the previous fsync ended, gathering the appends that arrive meanwhile
    /// (0: at once). An idle log writes and syncs at once whatever the value.
    pub commit_interval_ms: u64,
    /// The 32-byte key (raw or hex) for the `hmac` and `encrypted` content modes. Which mode is
    /// in force is the server policy's decision (`[audit] content`), not the configuration's.
    pub content_key_file: Option<PathBuf>,
    /// The origin (first checkpoint line) of a new log; a random one is generated if unset.
    pub origin: Option<String>,
    /// A witness-cosigned checkpoint the log must prove consistency with before appending.
    pub witness_checkpoint: Option<PathBuf>,
    /// Verifier keys (`name+hash+base64`) of the witnesses whose cosignatures are required on
    /// `witness_checkpoint`.
    pub witness_keys: Vec<String>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("/var/lib/inferno/audit"),
            checkpoint_every_records: 1000,
            checkpoint_every_seconds: 10,
            segment_max_bytes: 64 << 20,
            commit_interval_ms: 10,
            content_key_file: None,
            origin: None,
            witness_checkpoint: None,
            witness_keys: Vec::new(),
        }
    }
}
