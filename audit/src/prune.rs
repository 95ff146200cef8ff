//! Retention: export old segments, then remove them while the prune anchor and a signed
//! checkpoint keep the rest of the log verifiable.
//!
//! The anchor records the frontier (the roots of the maximal perfect subtrees) of the removed
//! leaves, the CRC chain value and the signing key in effect at the cut. It is written before
//! any segment is removed; segments numbered below it are ignored, so an interrupted prune
//! leaves a readable log and can simply be run again.

use std::io::Write as _;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use crate::lock::{DirLock, LockError};
use crate::merkle::Frontier;
use crate::recovery::{KeyHistory, key_for_size, track_record};
use crate::scan::{ANCHOR_FILE, ANCHOR_VERSION, PruneAnchor, read_checkpoints, scan_segments};
use crate::verify::{VerifyOptions, verify};

/// What a prune did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneOutcome {
    /// The number of segment files removed.
    pub segments_removed: usize,
    /// The number of records exported and removed.
    pub records_removed: u64,
    /// The index of the first record kept.
    pub first_index: u64,
}

/// Why a prune was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    /// The log does not verify; nothing is removed.
    #[error("log does not verify, refusing to prune: {0}")]
    NotIntact(String),
    /// Removing the requested segments would leave records not covered by a signed checkpoint.
    #[error("no signed checkpoint covers the cut at record {0}; write a checkpoint first")]
    Uncovered(u64),
    /// A writer has the log open (or the lock cannot be taken); nothing is removed.
    #[error("refusing to prune: {0}")]
    InUse(#[from] LockError),
    /// A file operation failed.
    #[error("{0}")]
    Io(String),
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> PruneError + '_ {
    move |e| PruneError::Io(format!("{}: {e}", path.display()))
}

/// Exports every record of all but the last `keep_segments` segments to `export` (JSON lines,
/// the exact stored bytes), then removes those segments. Refuses while a writer has the log
/// open, and keeps a writer from opening it meanwhile (the directory lock).
pub fn prune(dir: &Path, keep_segments: usize, export: &Path) -> Result<PruneOutcome, PruneError> {
    let _lock = DirLock::try_acquire(dir)?;
    let report = verify(dir, &VerifyOptions::default());
    if let Some(v) = &report.violation {
        return Err(PruneError::NotIntact(v.to_string()));
    }
    let mut history = KeyHistory::new();
    let mut payloads: Vec<(u64, Vec<u8>, std::path::PathBuf)> = Vec::new();
    let log = scan_segments(dir, |index, location, payload| {
        track_record(&mut history, index, payload)?;
        payloads.push((index, payload.to_vec(), location.file.clone()));
        Ok(())
    })
    .map_err(|e| PruneError::NotIntact(e.to_string()))?;
    let segments = &log.segments;
    let remove = segments.len().saturating_sub(keep_segments.max(1));
    let Some(first_kept) = segments.get(remove).and_then(|s| s.header.clone()) else {
        return Err(PruneError::NotIntact("no segment to keep".into()));
    };
    if remove == 0 {
        return Ok(PruneOutcome {
            segments_removed: 0,
            records_removed: 0,
            first_index: log.prefix.size(),
        });
    }
    let cut = first_kept.first_index;
    if report.checkpointed_size < cut {
        return Err(PruneError::Uncovered(cut));
    }
    let ckpts = read_checkpoints(dir).map_err(|e| PruneError::NotIntact(e.to_string()))?;
    if ckpts.checkpoints.is_empty() {
        return Err(PruneError::Uncovered(cut));
    }
    let mut out = crate::fileops::create_private(export).map_err(io(export))?;
    let mut frontier: Frontier = log.prefix.clone();
    for ((index, payload, _), hash) in payloads.iter().zip(&log.leaves) {
        if *index >= cut {
            break;
        }
        out.write_all(payload).map_err(io(export))?;
        out.write_all(b"\n").map_err(io(export))?;
        frontier.push(*hash);
    }
    out.sync_all().map_err(io(export))?;
    let anchor_key = log
        .anchor
        .as_ref()
        .and_then(|a| a.checkpoint_key.as_deref());
    let anchor = PruneAnchor {
        version: ANCHOR_VERSION,
        origin: log.origin.clone().unwrap_or_default(),
        first_index: cut,
        first_segment: first_kept.segment,
        prev_crc: first_kept.prev_crc,
        frontier: frontier.subtrees().iter().map(|h| B64.encode(h)).collect(),
        checkpoint_key: key_for_size(&history, anchor_key, cut),
    };
    let anchor_path = dir.join(ANCHOR_FILE);
    let tmp = dir.join(format!("{ANCHOR_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(&anchor).map_err(|e| PruneError::Io(e.to_string()))?;
    let mut f = crate::fileops::create_private(&tmp).map_err(io(&tmp))?;
    f.write_all(&json).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, &anchor_path).map_err(io(&anchor_path))?;
    let sync_dir = || {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))
    };
    sync_dir()?;
    for s in &segments[..remove] {
        std::fs::remove_file(&s.path).map_err(io(&s.path))?;
    }
    sync_dir()?;
    Ok(PruneOutcome {
        segments_removed: remove,
        records_removed: cut - log.prefix.size(),
        first_index: cut,
    })
}
