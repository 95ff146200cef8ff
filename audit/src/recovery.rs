//! Opening an existing log: scanning it, trimming a torn tail, checking it against its last
//! signed checkpoint and against the configured witness checkpoint.

use std::path::{Path, PathBuf};

use time::OffsetDateTime;

use crate::error::AuditError;
use crate::fileops::FileOps;
use crate::merkle::{Frontier, Hash, TreeView};
use crate::note::{SignedNote, VerifierKey};
use crate::record::{Record, RecordBody, SecurityEvent};
use crate::scan::{CHECKPOINTS_FILE, FaultKind, ScanFault, read_checkpoints, scan_segments};

/// The state of a log after recovery, from which the writer continues.
#[derive(Debug)]
pub struct Recovered {
    /// The log's origin, if the log has any segment or anchor.
    pub origin: Option<String>,
    /// The tree over all intact records.
    pub frontier: Frontier,
    /// The CRC chain value after the last record.
    pub chain: u32,
    /// The last segment: its number, path and whether it still exists with a valid header.
    pub last_segment: Option<(u64, PathBuf, bool)>,
    /// The length of the last segment after recovery.
    pub last_segment_len: u64,
    /// The CRC chain value after the last checkpoint, and whether the checkpoints file exists.
    pub checkpoints_chain: u32,
    /// Whether the checkpoints file exists with a valid header.
    pub checkpoints_exist: bool,
    /// The last signed checkpoint (note text).
    pub last_checkpoint: Option<String>,
    /// The verifier key of the last start event.
    pub previous_key: Option<String>,
    /// Recovery events to append.
    pub events: Vec<SecurityEvent>,
}

fn corrupt(fault: &ScanFault) -> AuditError {
    AuditError::Corrupt {
        location: fault.location.to_string(),
        reason: format!("record {}: {}", fault.index, fault.kind),
    }
}

/// The checkpoint verifier keys announced by start events, as `(index, key)` in order.
pub type KeyHistory = Vec<(u64, String)>;

/// Finds the key in effect for a checkpoint of tree size `size`: the key of the last start
/// event whose index is below `size`.
pub fn key_for_size(history: &KeyHistory, anchor_key: Option<&str>, size: u64) -> Option<String> {
    history
        .iter()
        .rev()
        .find(|(i, _)| *i < size)
        .map(|(_, k)| k.clone())
        .or_else(|| anchor_key.map(str::to_owned))
}

/// Collects the checkpoint keys of start events (the scan callback of recovery and verify).
pub fn track_record(
    history: &mut KeyHistory,
    index: u64,
    payload: &[u8],
) -> Result<Record, String> {
    let record = Record::decode(payload).map_err(|e| format!("not a valid record: {e}"))?;
    if record.index != index {
        return Err(format!(
            "record says index {}, stored at {index}",
            record.index
        ));
    }
    if let RecordBody::Event(SecurityEvent::Started { checkpoint_key, .. }) = &record.body {
        history.push((index, checkpoint_key.clone()));
    }
    Ok(record)
}

/// The time of the newest intact record of the log in `dir`; `None` for a new or empty log.
/// Start-up attestation takes it as a floor for the host-provided clock: a `now` earlier than a
/// time the appliance already wrote into its log is a clock rollback. Damage is left to
/// recovery, which runs next and reports it.
pub fn newest_record_time(dir: &Path) -> Result<Option<OffsetDateTime>, AuditError> {
    if !dir.exists() {
        return Ok(None);
    }
    let mut newest = None;
    scan_segments(dir, |_, _, payload| {
        let record = Record::decode(payload).map_err(|e| format!("not a valid record: {e}"))?;
        newest = newest.max(Some(record.time));
        Ok(())
    })?;
    Ok(newest)
}

/// Checks a signed checkpoint against the log: origin, signature by the key in effect, and
/// root hash at its size. Returns the checkpoint's size.
pub fn check_against_log(
    note_text: &str,
    origin: Option<&str>,
    view: &TreeView<'_>,
    history: &KeyHistory,
    anchor_key: Option<&str>,
) -> Result<u64, String> {
    let note = SignedNote::parse(note_text).map_err(|e| e.to_string())?;
    let cp = note.checkpoint().map_err(|e| e.to_string())?;
    if origin.is_some_and(|o| o != cp.origin) {
        return Err(format!(
            "checkpoint origin {:?} is not this log's",
            cp.origin
        ));
    }
    if cp.size > view.size() {
        return Err(format!(
            "checkpoint covers {} records but the log has only {} (truncated or rolled back)",
            cp.size,
            view.size()
        ));
    }
    let key = key_for_size(history, anchor_key, cp.size)
        .ok_or_else(|| format!("no start event announces a key for size {}", cp.size))?;
    let key = VerifierKey::parse(&key).map_err(|e| e.to_string())?;
    key.verify(&note).map_err(|e| e.to_string())?;
    let root: Hash = view.root_at(cp.size).map_err(|e| e.to_string())?;
    if root != cp.root {
        return Err(format!(
            "root hash at size {} does not match the signed checkpoint (log altered or forked)",
            cp.size
        ));
    }
    Ok(cp.size)
}

/// Scans and repairs the log in `dir`.
pub fn recover(dir: &Path, ops: &dyn FileOps) -> Result<Recovered, AuditError> {
    let mut events = Vec::new();
    let ckpts = read_checkpoints(dir)?;
    let ck_path = dir.join(CHECKPOINTS_FILE);
    let mut checkpoints_exist = ckpts.file_len > 0;
    if let Some(fault) = &ckpts.fault {
        if !fault.torn_tail {
            return Err(corrupt(fault));
        }
        let header_torn = matches!(fault.kind, FaultKind::Header(_));
        if header_torn {
            ops.remove(&ck_path)
                .map_err(|e| AuditError::io(format!("removing {}", ck_path.display()), e))?;
            checkpoints_exist = false;
        } else {
            ops.truncate(&ck_path, ckpts.valid_len)
                .map_err(|e| AuditError::io(format!("truncating {}", ck_path.display()), e))?;
        }
        events.push(SecurityEvent::Recovery {
            segment: CHECKPOINTS_FILE.to_owned(),
            offset: fault.location.offset,
            truncated_bytes: ckpts.file_len - fault.location.offset,
            reason: format!("torn checkpoint write: {}", fault.kind),
        });
    }
    let last_checkpoint = ckpts.checkpoints.last().map(|c| c.note.clone());
    let last_ck_size = match &last_checkpoint {
        Some(text) => SignedNote::parse(text)
            .and_then(|n| n.checkpoint())
            .map(|c| c.size)
            .map_err(|e| AuditError::Corrupt {
                location: ckpts
                    .checkpoints
                    .last()
                    .map_or(String::new(), |c| c.location.to_string()),
                reason: e.to_string(),
            })?,
        None => 0,
    };

    let mut history = KeyHistory::new();
    let log = scan_segments(dir, |index, _, payload| {
        track_record(&mut history, index, payload).map(drop)
    })?;
    // The checkpoints file is created (durably) before the first segment, and every start
    // signs a checkpoint: a log with segments but no checkpoints file lost it.
    if !log.segments.is_empty() && ckpts.file_len == 0 {
        return Err(AuditError::Corrupt {
            location: ck_path.display().to_string(),
            reason: "the log has segments but its checkpoints file is missing or empty".into(),
        });
    }
    let mut last_segment = log.segments.last().map(|s| {
        let number = s.header.as_ref().map(|h| h.segment);
        (number, s.path.clone(), s.header.is_some())
    });
    let mut last_segment_len = log.segments.last().map_or(0, |s| s.valid_len);
    if let Some(fault) = &log.fault {
        if !fault.torn_tail || fault.index < last_ck_size {
            return Err(corrupt(fault));
        }
        let path = &fault.location.file;
        let file_len = log.segments.last().map_or(0, |s| s.file_len);
        if matches!(fault.kind, FaultKind::Header(_)) {
            ops.remove(path)
                .map_err(|e| AuditError::io(format!("removing {}", path.display()), e))?;
            ops.sync_dir(dir)
                .map_err(|e| AuditError::io(format!("syncing {}", dir.display()), e))?;
            last_segment = last_segment.map(|(n, p, _)| (n, p, false));
            last_segment_len = 0;
        } else {
            ops.truncate(path, fault.location.offset)
                .map_err(|e| AuditError::io(format!("truncating {}", path.display()), e))?;
        }
        tracing::warn!(location = %fault.location, reason = %fault.kind, "audit log: truncated torn tail");
        events.push(SecurityEvent::Recovery {
            segment: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            offset: fault.location.offset,
            truncated_bytes: file_len - fault.location.offset,
            reason: format!("torn tail: {}", fault.kind),
        });
    }
    let view = TreeView::new(&log.prefix, &log.leaves);
    let anchor_key = log
        .anchor
        .as_ref()
        .and_then(|a| a.checkpoint_key.as_deref());
    if let (Some(text), Some(stored)) = (&last_checkpoint, ckpts.checkpoints.last()) {
        check_against_log(text, log.origin.as_deref(), &view, &history, anchor_key).map_err(
            |reason| AuditError::Corrupt {
                location: stored.location.to_string(),
                reason,
            },
        )?;
    }
    let mut frontier = log.prefix.clone();
    for h in &log.leaves {
        frontier.push(*h);
    }
    // Records past the last signed checkpoint were never acknowledged (an append is answered
    // only once a checkpoint covers it): the previous run died before signing them. This start
    // signs them, so say so in the log rather than sign them silently.
    if last_checkpoint.is_some() && frontier.size() > last_ck_size {
        tracing::warn!(
            signed = last_ck_size,
            size = frontier.size(),
            "audit log: records past the last signed checkpoint (unacknowledged) are signed only now"
        );
        events.push(SecurityEvent::Recovery {
            segment: last_segment
                .as_ref()
                .and_then(|(_, p, _)| p.file_name())
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            offset: last_segment_len,
            truncated_bytes: 0,
            reason: format!(
                "{} unacknowledged record(s) {}..{} follow the last signed checkpoint; signed at this start",
                frontier.size() - last_ck_size,
                last_ck_size,
                frontier.size()
            ),
        });
    }
    let segment_number = |path: &Path| -> u64 {
        path.file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    Ok(Recovered {
        origin: log.origin.clone(),
        frontier,
        chain: log.chain,
        last_segment: last_segment
            .map(|(n, p, ok)| (n.unwrap_or_else(|| segment_number(&p)), p, ok)),
        last_segment_len,
        checkpoints_chain: ckpts.chain,
        checkpoints_exist,
        last_checkpoint,
        previous_key: history
            .last()
            .map(|(_, k)| k.clone())
            .or(anchor_key.map(str::to_owned)),
        events,
    })
}

/// Proves the log consistent with a witness-cosigned checkpoint before it is appended to.
///
/// The checkpoint must carry a valid cosignature from every key in `witness_keys` and a valid
/// log signature, and the log must contain its tree as a prefix.
pub fn check_witness(
    dir: &Path,
    checkpoint_file: &Path,
    witness_keys: &[String],
) -> Result<(), AuditError> {
    let text = std::fs::read_to_string(checkpoint_file).map_err(|e| {
        AuditError::Witness(format!(
            "cannot read witness checkpoint {}: {e}",
            checkpoint_file.display()
        ))
    })?;
    let note = SignedNote::parse(&text)
        .map_err(|e| AuditError::Witness(format!("{}: {e}", checkpoint_file.display())))?;
    if witness_keys.is_empty() {
        return Err(AuditError::Witness(
            "a witness checkpoint is configured but no witness keys are".into(),
        ));
    }
    for k in witness_keys {
        let key = VerifierKey::parse(k)
            .map_err(|e| AuditError::Witness(format!("witness key {k:?}: {e}")))?;
        key.verify(&note)
            .map_err(|e| AuditError::Witness(format!("{}: {e}", checkpoint_file.display())))?;
    }
    let mut history = KeyHistory::new();
    let log = scan_segments(dir, |index, _, payload| {
        track_record(&mut history, index, payload).map(drop)
    })
    .map_err(|e| AuditError::Witness(e.to_string()))?;
    if let Some(f) = &log.fault {
        return Err(corrupt(f));
    }
    let view = TreeView::new(&log.prefix, &log.leaves);
    let anchor_key = log
        .anchor
        .as_ref()
        .and_then(|a| a.checkpoint_key.as_deref());
    let size = check_against_log(&text, log.origin.as_deref(), &view, &history, anchor_key)
        .map_err(|e| {
            AuditError::Witness(format!("not consistent with the witnessed checkpoint: {e}"))
        })?;
    let cp = note.checkpoint()?;
    let proof = view
        .consistency_proof(size, view.size())
        .map_err(|e| AuditError::Witness(e.to_string()))?;
    let new_root = view
        .root_at(view.size())
        .map_err(|e| AuditError::Witness(e.to_string()))?;
    crate::merkle::verify_consistency(size, view.size(), &cp.root, &new_root, &proof)
        .map_err(|e| AuditError::Witness(format!("consistency proof failed: {e}")))?;
    tracing::info!(
        witnessed_size = size,
        log_size = view.size(),
        "audit log consistent with witness checkpoint"
    );
    Ok(())
}
