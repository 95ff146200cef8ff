//! Offline verification of a log directory: frames and CRC chain, record sequence, every
//! checkpoint signature and root hash, and (optionally) a trusted checkpoint.

use std::collections::BTreeMap;
use std::path::Path;

use crate::merkle::Frontier;
use crate::note::{SignedNote, VerifierKey};
use crate::record::{EvidenceBlob, RecordBody, SecurityEvent};
use crate::recovery::{KeyHistory, key_for_size, track_record};
use crate::scan::{Location, read_checkpoints, scan_segments};

/// A violation: the first place where the log is not intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Where (file and byte offset), if it is in a file.
    pub location: Option<Location>,
    /// The record index concerned, if any.
    pub index: Option<u64>,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(i) = self.index {
            write!(f, "record {i}: ")?;
        }
        if let Some(l) = &self.location {
            write!(f, "{l}: ")?;
        }
        f.write_str(&self.reason)
    }
}

/// A start event found in the log: the key it announced and the evidence that binds it.
#[derive(Debug, Clone, PartialEq)]
pub struct StartEvent {
    /// The record index.
    pub index: u64,
    /// The checkpoint verifier key.
    pub checkpoint_key: String,
    /// The attestation evidence.
    pub evidence: Vec<EvidenceBlob>,
}

/// The outcome of verifying a log.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The log's origin.
    pub origin: Option<String>,
    /// The index of the first kept record (non-zero after pruning).
    pub first_index: u64,
    /// The number of intact records (including pruned ones).
    pub size: u64,
    /// The number of checkpoints whose signature and root were checked.
    pub checkpoints_checked: usize,
    /// The number of checkpoints older than the prune point (not checkable).
    pub checkpoints_pruned: usize,
    /// The size of the latest valid checkpoint.
    pub checkpointed_size: u64,
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// Request ids with a request record but no completion record.
    pub incomplete: Vec<String>,
    /// The start events, for checking key bindings against attestation evidence.
    pub starts: Vec<StartEvent>,
}

impl Report {
    /// Whether the log is intact.
    pub fn intact(&self) -> bool {
        self.violation.is_none()
    }

    /// The one-line verdict.
    pub fn verdict(&self) -> String {
        match &self.violation {
            Some(v) => format!("VIOLATION: {v}"),
            None => {
                let mut s = format!(
                    "INTACT: {} records, {} checkpoints verified, signed up to size {}",
                    self.size, self.checkpoints_checked, self.checkpointed_size
                );
                let unsigned = self.size - self.checkpointed_size;
                if unsigned > 0 {
                    s.push_str(&format!(
                        ", {unsigned} records after the last checkpoint not yet signed (never acknowledged)"
                    ));
                }
                if self.first_index > 0 {
                    s.push_str(&format!(", pruned before record {}", self.first_index));
                }
                if !self.incomplete.is_empty() {
                    s.push_str(&format!(", {} incomplete requests", self.incomplete.len()));
                }
                s
            }
        }
    }
}

/// Verification options.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// A checkpoint the auditor trusts (e.g. witness-cosigned); the log must extend it.
    pub trusted_checkpoint: Option<String>,
    /// Witness keys whose cosignatures the trusted checkpoint must carry.
    pub witness_keys: Vec<VerifierKey>,
}

/// What a directory lacks to be a log: its segments, its checkpoints file, or both. A log
/// the writer created always has both (its first segment and a signed checkpoint).
fn missing_files(dir: &Path) -> Option<Violation> {
    let segments = match crate::segment::list_segments(dir) {
        Ok(s) => s,
        Err(e) => {
            return Some(Violation {
                location: None,
                index: None,
                reason: format!("cannot list {}: {e}", dir.display()),
            });
        }
    };
    let checkpoints = dir.join(crate::scan::CHECKPOINTS_FILE);
    let missing = match (segments.is_empty(), checkpoints.exists()) {
        (true, false) => format!(
            "{} is not an audit log: it has no segment files (*.seg) and no {}",
            dir.display(),
            crate::scan::CHECKPOINTS_FILE
        ),
        (true, true) => format!(
            "{} has no segment files (*.seg): the log's records are missing",
            dir.display()
        ),
        (false, false) => format!(
            "{} has no {}: the log's checkpoints file is missing, so no signed checkpoint covers it",
            dir.display(),
            crate::scan::CHECKPOINTS_FILE
        ),
        (false, true) => return None,
    };
    Some(Violation {
        location: None,
        index: None,
        reason: missing,
    })
}

/// Verifies the log in `dir`. A directory without segments, without a checkpoints file or
/// without a signed checkpoint is a violation: only a log the writer created and signed is
/// intact, even when it holds no record.
pub fn verify(dir: &Path, options: &VerifyOptions) -> Report {
    let mut report = Report::default();
    if let Some(v) = missing_files(dir) {
        report.violation = Some(v);
        return report;
    }
    let mut history = KeyHistory::new();
    let mut requests: BTreeMap<String, u64> = BTreeMap::new();
    let mut starts = Vec::new();
    let scanned = scan_segments(dir, |index, _, payload| {
        let record = track_record(&mut history, index, payload)?;
        match &record.body {
            // A request answered without generation carries its status and has no completion.
            RecordBody::Request(r) if r.status.is_none() => {
                requests.insert(r.request_id.clone(), index);
            }
            RecordBody::Request(_) => {}
            RecordBody::Completion(c) => {
                requests.remove(&c.request_id);
            }
            RecordBody::Event(SecurityEvent::Started {
                checkpoint_key,
                evidence,
                ..
            }) => starts.push(StartEvent {
                index,
                checkpoint_key: checkpoint_key.clone(),
                evidence: evidence.clone(),
            }),
            RecordBody::Event(_) => {}
        }
        Ok(())
    });
    let log = match scanned {
        Ok(l) => l,
        Err(reason) => {
            report.violation = Some(Violation {
                location: None,
                index: None,
                reason: reason.to_string(),
            });
            return report;
        }
    };
    report.origin = log.origin.clone();
    report.first_index = log.prefix.size();
    report.size = log.size();
    report.starts = starts;
    report.incomplete = requests.into_keys().collect();
    let ckpts = match read_checkpoints(dir) {
        Ok(c) => c,
        Err(reason) => {
            report.violation = Some(Violation {
                location: None,
                index: None,
                reason: reason.to_string(),
            });
            return report;
        }
    };
    if let Some(f) = &ckpts.fault {
        report.violation = Some(Violation {
            location: Some(f.location.clone()),
            index: None,
            reason: format!(
                "checkpoint {}: {}{}",
                f.index,
                f.kind,
                torn_note(f.torn_tail)
            ),
        });
        return report;
    }
    if let Some(f) = &log.fault {
        let last_size = ckpts
            .checkpoints
            .last()
            .and_then(|c| SignedNote::parse(&c.note).and_then(|n| n.checkpoint()).ok())
            .map_or(0, |c| c.size);
        let torn = f.torn_tail && f.index >= last_size;
        report.violation = Some(Violation {
            location: Some(f.location.clone()),
            index: Some(f.index),
            reason: format!("{}{}", f.kind, torn_note(torn)),
        });
        return report;
    }
    let anchor_key = log.anchor.as_ref().and_then(|a| a.checkpoint_key.clone());
    let mut notes = Vec::new();
    for stored in &ckpts.checkpoints {
        let fail = |reason: String| Violation {
            location: Some(stored.location.clone()),
            index: None,
            reason,
        };
        let parsed = SignedNote::parse(&stored.note)
            .and_then(|n| n.checkpoint().map(|c| (n, c)))
            .map_err(|e| fail(e.to_string()));
        let (note, cp) = match parsed {
            Ok(x) => x,
            Err(v) => {
                report.violation = Some(v);
                return report;
            }
        };
        if log.origin.as_ref().is_some_and(|o| o != &cp.origin) {
            report.violation = Some(fail(format!(
                "checkpoint origin {:?} is not the log's",
                cp.origin
            )));
            return report;
        }
        if let Some((_, prev)) = notes.last() {
            let prev: &crate::note::Checkpoint = prev;
            if cp.size < prev.size {
                report.violation = Some(fail(format!(
                    "checkpoint size {} is smaller than the previous checkpoint's {}",
                    cp.size, prev.size
                )));
                return report;
            }
        }
        if cp.size < log.prefix.size() {
            report.checkpoints_pruned += 1;
            continue;
        }
        if cp.size == 0 && history.is_empty() && anchor_key.is_none() {
            // A checkpoint of the empty tree, before any start event named a key: its root is
            // checked below; no key can be known to check its signature against.
            notes.push((stored.location.clone(), cp));
            continue;
        }
        let key = key_for_size(&history, anchor_key.as_deref(), cp.size)
            .ok_or_else(|| {
                fail(format!(
                    "no start event announces a signing key before record {}",
                    cp.size
                ))
            })
            .and_then(|k| VerifierKey::parse(&k).map_err(|e| fail(e.to_string())))
            .and_then(|k| k.verify(&note).map(drop).map_err(|e| fail(e.to_string())));
        if let Err(v) = key {
            report.violation = Some(v);
            return report;
        }
        notes.push((stored.location.clone(), cp));
    }
    // Recompute the root at every checkpointed size in one pass over the leaves. Matching roots
    // at every size imply that consecutive checkpoints are consistent.
    let mut frontier: Frontier = log.prefix.clone();
    let mut leaves = log.leaves.iter();
    for (location, cp) in &notes {
        while frontier.size() < cp.size {
            match leaves.next() {
                Some(h) => frontier.push(*h),
                None => break,
            }
        }
        if frontier.size() < cp.size {
            let reason = format!(
                "checkpoint covers {} records but only {} are intact (truncated or damaged log)",
                cp.size,
                frontier.size()
            );
            report.violation = Some(Violation {
                location: Some(location.clone()),
                index: None,
                reason: reason.to_string(),
            });
            return report;
        }
        if frontier.root() != cp.root {
            report.violation = Some(Violation {
                location: Some(location.clone()),
                index: None,
                reason: format!(
                    "root hash at size {} does not match the signed checkpoint",
                    cp.size
                ),
            });
            return report;
        }
        report.checkpoints_checked += 1;
        report.checkpointed_size = cp.size;
    }
    if report.checkpoints_checked == 0 {
        let reason = if ckpts.checkpoints.is_empty() {
            "holds no signed checkpoint: nothing signed covers the log (the writer signs one at every start)"
        } else {
            "no signed checkpoint covers the log's kept records (the writer signs one at every start)"
        };
        report.violation = Some(Violation {
            location: Some(Location {
                file: dir.join(crate::scan::CHECKPOINTS_FILE),
                offset: 0,
            }),
            index: None,
            reason: reason.into(),
        });
        return report;
    }
    if let Some(text) = &options.trusted_checkpoint
        && let Err(reason) = check_trusted(text, &log, &history, anchor_key.as_deref(), options)
    {
        report.violation = Some(Violation {
            location: None,
            index: None,
            reason: format!("trusted checkpoint: {reason}"),
        });
    }
    report
}

/// Explains a damaged tail that recovery would trim: it is still reported, because the
/// verifier only calls intact a log with no damaged byte.
fn torn_note(torn: bool) -> &'static str {
    if torn {
        " (torn tail of unacknowledged writes beyond the last checkpoint; the appliance trims it at its next start)"
    } else {
        ""
    }
}

fn check_trusted(
    text: &str,
    log: &crate::scan::ScannedLog,
    history: &KeyHistory,
    anchor_key: Option<&str>,
    options: &VerifyOptions,
) -> Result<(), String> {
    let note = SignedNote::parse(text).map_err(|e| e.to_string())?;
    for w in &options.witness_keys {
        w.verify(&note).map_err(|e| e.to_string())?;
    }
    let view = crate::merkle::TreeView::new(&log.prefix, &log.leaves);
    crate::recovery::check_against_log(text, log.origin.as_deref(), &view, history, anchor_key)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::empty_root;
    use crate::note::{Checkpoint, NoteSigner};
    use crate::scan::{CHECKPOINTS_FILE, checkpoints_header};
    use crate::segment::{SegmentHeader, segment_path};

    const ORIGIN: &str = "verify.test/log";

    fn empty_segment(dir: &Path) {
        let header = SegmentHeader {
            segment: 0,
            first_index: 0,
            prev_crc: 0,
            origin: ORIGIN.into(),
        };
        std::fs::write(segment_path(dir, 0), header.encode()).expect("segment");
    }

    fn checkpoints(dir: &Path, notes: &[String]) {
        let mut bytes = checkpoints_header();
        let mut chain = 0;
        for note in notes {
            chain = crate::frame::encode_frame(chain, note.as_bytes(), &mut bytes);
        }
        std::fs::write(dir.join(CHECKPOINTS_FILE), bytes).expect("checkpoints");
    }

    fn empty_checkpoint() -> String {
        NoteSigner::generate(ORIGIN)
            .expect("signer")
            .sign_checkpoint(&Checkpoint {
                origin: ORIGIN.into(),
                size: 0,
                root: empty_root(),
            })
            .render()
    }

    fn violation(dir: &Path) -> String {
        let report = verify(dir, &VerifyOptions::default());
        assert!(!report.intact(), "{}", report.verdict());
        report.verdict()
    }

    #[test]
    fn a_directory_without_a_log_is_a_violation() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let v = violation(tmp.path());
        assert!(v.contains("is not an audit log"), "{v}");
        assert!(
            v.contains("no segment files") && v.contains(CHECKPOINTS_FILE),
            "{v}"
        );

        // A model directory: files, none of them a log's.
        std::fs::write(tmp.path().join("config.json"), "{}").expect("write");
        std::fs::write(tmp.path().join("model.safetensors"), [0u8; 64]).expect("write");
        assert!(violation(tmp.path()).contains("is not an audit log"));
    }

    #[test]
    fn missing_segments_checkpoints_or_signatures_are_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        checkpoints(tmp.path(), &[empty_checkpoint()]);
        let v = violation(tmp.path());
        assert!(v.contains("no segment files (*.seg)"), "{v}");

        let tmp = tempfile::tempdir().expect("tempdir");
        empty_segment(tmp.path());
        let v = violation(tmp.path());
        assert!(v.contains(&format!("has no {CHECKPOINTS_FILE}")), "{v}");

        // Both files, but the checkpoints file holds nothing signed.
        checkpoints(tmp.path(), &[]);
        let v = violation(tmp.path());
        assert!(v.contains("holds no signed checkpoint"), "{v}");
    }

    #[test]
    fn an_empty_log_with_a_signed_empty_checkpoint_is_intact() {
        let tmp = tempfile::tempdir().expect("tempdir");
        empty_segment(tmp.path());
        checkpoints(tmp.path(), &[empty_checkpoint()]);
        let report = verify(tmp.path(), &VerifyOptions::default());
        assert!(report.intact(), "{}", report.verdict());
        assert_eq!((report.size, report.checkpoints_checked), (0, 1));

        // The same checkpoint claiming a root other than the empty tree's is not.
        let bad = NoteSigner::generate(ORIGIN)
            .expect("signer")
            .sign_checkpoint(&Checkpoint {
                origin: ORIGIN.into(),
                size: 0,
                root: [7; 32],
            })
            .render();
        checkpoints(tmp.path(), &[bad]);
        assert!(violation(tmp.path()).contains("root hash at size 0"));
    }
}
