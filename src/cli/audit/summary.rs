//! The summary `inferno audit verify` prints under its verdict (and as `--json`): what was
//! verified (files and keys, with digests), the time span, the server's runs, the records and
//! checkpoints counted, the witness's cosignatures and the gaps in checkpointing.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use inferno_attestation::evidence::Evidence;
use inferno_attestation::runtime_data::RuntimeData;
use inferno_audit::note::{SignedNote, VerifierKey};
use inferno_audit::{Record, RecordBody, Report, SecurityEvent, stored_checkpoints};

/// A span of this many seconds or more between consecutive checkpoints of one run, while
/// records were written, is reported as a gap (the writer signs every acknowledged record
/// within seconds).
pub const DEFAULT_GAP_SECONDS: u64 = 60;

/// The summary of a verified log.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `INTACT` or `VIOLATION`.
    pub verdict: &'static str,
    /// The one-line verdict.
    pub verdict_line: String,
    /// The violation, if any.
    pub violation: Option<String>,
    /// The binding check of `--policy`/`--collateral`, when asked for.
    pub attested: Option<String>,
    /// The log directory and its files, with SHA-256 digests.
    pub log: LogFiles,
    /// The log's origin.
    pub origin: Option<String>,
    /// The time of the first kept record.
    pub first_record_time: Option<String>,
    /// The time of the last record.
    pub last_record_time: Option<String>,
    /// Records counted.
    pub records: RecordCounts,
    /// Checkpoints counted.
    pub checkpoints: CheckpointCounts,
    /// The last verified checkpoint.
    pub last_checkpoint: Option<CheckpointInfo>,
    /// The checkpoint signing keys the start events announced, with their SHA-256.
    pub keys: Vec<KeyInfo>,
    /// The server's runs (one per start event), oldest first.
    pub runs: Vec<Run>,
    /// The witness's cosignatures on `--trusted-checkpoint`, when given.
    pub witness: Option<WitnessStatus>,
    /// Time without checkpoints while the server wrote records.
    pub gaps: Vec<Gap>,
    /// Request ids with a request record but no completion record.
    pub incomplete_requests: Vec<String>,
}

/// A file of the log directory.
#[derive(Debug, Clone, Serialize)]
pub struct FileDigest {
    /// Its name in the directory.
    pub name: String,
    /// Its length in bytes.
    pub bytes: u64,
    /// Hex SHA-256 of its content.
    pub sha256: String,
}

/// The log directory and its files.
#[derive(Debug, Clone, Serialize)]
pub struct LogFiles {
    /// The directory as given.
    pub dir: String,
    /// Segments, the checkpoints file and the prune anchor, by name.
    pub files: Vec<FileDigest>,
}

/// Records counted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecordCounts {
    /// Intact records, pruned ones included.
    pub total: u64,
    /// The index of the first kept record (non-zero after a prune).
    pub first_index: u64,
    /// Request records.
    pub requests: u64,
    /// Completion records.
    pub completions: u64,
    /// Security events.
    pub events: u64,
    /// Records after the last checkpoint (not yet signed).
    pub unsigned: u64,
}

/// Checkpoints counted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckpointCounts {
    /// Checkpoints stored.
    pub stored: usize,
    /// Checkpoints whose signature and root were verified.
    pub verified: usize,
    /// Checkpoints older than the prune point (not checkable).
    pub pruned: usize,
}

/// A checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointInfo {
    /// The tree size it signs.
    pub size: u64,
    /// The root hash, base64 (as in the note).
    pub root: String,
    /// The time of the last record it covers.
    pub covers_until: Option<String>,
    /// The names of the keys that signed it.
    pub signers: Vec<String>,
}

/// A checkpoint signing key.
#[derive(Debug, Clone, Serialize)]
pub struct KeyInfo {
    /// The note verifier key.
    pub key: String,
    /// Hex SHA-256 of the verifier key string.
    pub sha256: String,
    /// The index of the start event that announced it.
    pub announced_at: u64,
}

/// One run of the server: from a start event to the next (or the end of the log).
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The index of the start event.
    pub start_index: u64,
    /// When it started.
    pub started: String,
    /// The software version.
    pub software_version: String,
    /// Hex SHA-256 of the server policy in force.
    pub policy_digest: Option<String>,
    /// The served model's digest, as bound into the start evidence.
    pub model_digest: Option<String>,
    /// The start-up appraisal's verdict: `passed`, `SIMULATED`, `failed` or `not recorded`.
    pub attestation: String,
    /// The start-up appraisal's explanation.
    pub attestation_detail: Option<String>,
    /// When and why it stopped, if a stop event says so.
    pub stopped: Option<String>,
    /// The number of records of the run.
    pub records: u64,
}

/// The cosignatures of the trusted checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct WitnessStatus {
    /// The trusted checkpoint's size.
    pub size: Option<u64>,
    /// Whether the log contains it (same root at its size) and it carries every required
    /// cosignature: the verdict's `trusted checkpoint` check.
    pub contained: bool,
    /// Its cosignature lines.
    pub cosignatures: Vec<Cosignature>,
    /// The witness keys given, and whether each one's cosignature verified.
    pub required: Vec<RequiredWitness>,
}

/// A `cosignature/v1` line.
#[derive(Debug, Clone, Serialize)]
pub struct Cosignature {
    /// The witness's key name.
    pub name: String,
    /// Hex key hash.
    pub key_hash: String,
    /// When the witness cosigned (RFC 3339).
    pub time: Option<String>,
}

/// A witness key the auditor required.
#[derive(Debug, Clone, Serialize)]
pub struct RequiredWitness {
    /// The witness key's name.
    pub name: String,
    /// Whether its cosignature verified.
    pub verified: bool,
}

/// Time without a checkpoint while records were written: the first record a checkpoint
/// signed waited this long for it.
#[derive(Debug, Clone, Serialize)]
pub struct Gap {
    /// From (the first record after the previous checkpoint).
    pub from: String,
    /// Until (the last record covered by the checkpoint that ended the gap, or the last record).
    pub until: String,
    /// Its length in seconds.
    pub seconds: i64,
    /// Records written meanwhile.
    pub records: u64,
    /// Why it is a gap.
    pub kind: String,
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Digests of the files that make up the log in `dir` (segments, checkpoints, prune anchor).
pub fn log_files(dir: &Path) -> Vec<FileDigest> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let wanted = name.ends_with(".seg")
            || name == inferno_audit::CHECKPOINTS_FILE
            || name == "prune-anchor.json";
        if !wanted {
            continue;
        }
        if let Ok(bytes) = std::fs::read(entry.path()) {
            files.push(FileDigest {
                sha256: sha256_hex(&bytes),
                bytes: bytes.len() as u64,
                name,
            });
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files
}

/// What the start evidence's runtime-data document binds: (model digest, policy digest).
fn bound_digests(evidence: &[inferno_audit::EvidenceBlob]) -> (Option<String>, Option<String>) {
    let doc = evidence
        .iter()
        .find(|b| b.kind == crate::attest::EVIDENCE_BLOB_KIND)
        .and_then(|b| B64.decode(b.data_b64.as_bytes()).ok())
        .and_then(|bytes| Evidence::from_bytes(&bytes).ok())
        .and_then(|e| e.runtime_data)
        .and_then(|rd| RuntimeData::from_canonical_bytes(&rd.0).ok());
    match doc {
        Some(d) => (d.model_digest, Some(d.policy_sha256)),
        None => (None, None),
    }
}

fn runs(records: &[Record]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for r in records {
        if let RecordBody::Event(SecurityEvent::Started {
            software_version,
            evidence,
            ..
        }) = &r.body
        {
            let (model_digest, policy_digest) = bound_digests(evidence);
            runs.push(Run {
                start_index: r.index,
                started: rfc3339(r.time),
                software_version: software_version.clone(),
                policy_digest,
                model_digest,
                attestation: "not recorded".into(),
                attestation_detail: None,
                stopped: None,
                records: 0,
            });
        }
        let Some(run) = runs.last_mut() else {
            continue;
        };
        run.records += 1;
        match &r.body {
            RecordBody::Event(SecurityEvent::Appraisal {
                subject,
                passed,
                detail,
                ..
            }) if subject == "startup" && run.attestation_detail.is_none() => {
                run.attestation = match (*passed, detail.contains("SIMULATED")) {
                    (false, _) => "failed",
                    (true, true) => "SIMULATED",
                    (true, false) => "passed",
                }
                .into();
                run.attestation_detail = Some(detail.clone());
            }
            RecordBody::Event(SecurityEvent::PolicyConfig { policy_digest, .. })
                if run.policy_digest.is_none() =>
            {
                run.policy_digest.clone_from(policy_digest);
            }
            RecordBody::Request(q) if run.model_digest.is_none() => {
                run.model_digest = Some(q.model_digest.clone());
            }
            RecordBody::Event(SecurityEvent::Stopped { reason }) => {
                run.stopped = Some(format!("{} ({reason})", rfc3339(r.time)));
            }
            _ => {}
        }
    }
    runs
}

/// Gaps between consecutive verified checkpoint sizes (see [`DEFAULT_GAP_SECONDS`]) and the
/// unsigned tail. `first_index` is the index of `records[0]`.
fn gaps(records: &[Record], first_index: u64, sizes: &[u64], limit: u64) -> Vec<Gap> {
    let at = |index: u64| -> Option<&Record> {
        index
            .checked_sub(first_index)
            .and_then(|i| records.get(usize::try_from(i).ok()?))
    };
    let mut out = Vec::new();
    let mut bounds: Vec<u64> = sizes.iter().copied().filter(|s| *s > first_index).collect();
    bounds.dedup();
    let mut previous = first_index;
    for &size in &bounds {
        if let (Some(from), Some(until)) = (at(previous), at(size - 1)) {
            let seconds = (until.time - from.time).whole_seconds();
            let restarted = (previous + 1..size).any(|i| {
                at(i).is_some_and(|r| {
                    matches!(r.body, RecordBody::Event(SecurityEvent::Started { .. }))
                })
            });
            let kind = if restarted {
                Some("a run ended without signing its last records; the next start signed them")
            } else if seconds >= i64::try_from(limit).unwrap_or(i64::MAX) {
                Some("no checkpoint while records were written")
            } else {
                None
            };
            if let Some(kind) = kind {
                out.push(Gap {
                    from: rfc3339(from.time),
                    until: rfc3339(until.time),
                    seconds,
                    records: size - previous,
                    kind: kind.into(),
                });
            }
        }
        previous = size;
    }
    let end = first_index + records.len() as u64;
    if end > previous
        && let (Some(from), Some(until)) = (at(previous), at(end - 1))
    {
        out.push(Gap {
            from: rfc3339(from.time),
            until: rfc3339(until.time),
            seconds: (until.time - from.time).whole_seconds(),
            records: end - previous,
            kind: "records after the last checkpoint, not signed".into(),
        });
    }
    out
}

fn witness_status(text: &str, keys: &[VerifierKey], contained: bool) -> WitnessStatus {
    let note = SignedNote::parse(text).ok();
    let cosignatures = note
        .iter()
        .flat_map(|n| &n.signatures)
        .filter(|s| s.bytes.len() == 72)
        .map(|s| {
            let ts = s.bytes[..8]
                .try_into()
                .ok()
                .map(u64::from_be_bytes)
                .and_then(|t| i64::try_from(t).ok())
                .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok());
            Cosignature {
                name: s.name.clone(),
                key_hash: hex::encode(s.key_hash),
                time: ts.map(rfc3339),
            }
        })
        .collect();
    let required = keys
        .iter()
        .map(|k| RequiredWitness {
            name: k.name.clone(),
            verified: note.as_ref().is_some_and(|n| k.verify(n).is_ok()),
        })
        .collect();
    WitnessStatus {
        size: note
            .as_ref()
            .and_then(|n| n.checkpoint().ok())
            .map(|c| c.size),
        contained,
        cosignatures,
        required,
    }
}

/// What the summary is built from besides the log directory.
pub struct SummaryInput<'a> {
    /// The verifier's report.
    pub report: &'a Report,
    /// The log's records (empty when they could not be read).
    pub records: &'a [Record],
    /// `--trusted-checkpoint`'s text.
    pub trusted_checkpoint: Option<&'a str>,
    /// `--witness-key`s.
    pub witness_keys: &'a [VerifierKey],
    /// The binding check's outcome line, when asked for.
    pub attested: Option<String>,
    /// The gap threshold in seconds.
    pub gap_seconds: u64,
}

/// Builds the summary of the log in `dir`.
pub fn summarize(dir: &Path, input: &SummaryInput<'_>) -> Summary {
    let report = input.report;
    let records = input.records;
    let notes: Vec<(SignedNote, inferno_audit::note::Checkpoint)> = stored_checkpoints(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|t| {
            let n = SignedNote::parse(t).ok()?;
            let c = n.checkpoint().ok()?;
            Some((n, c))
        })
        .collect();
    let time_of = |index: u64| {
        index
            .checked_sub(report.first_index)
            .and_then(|i| records.get(usize::try_from(i).ok()?))
            .map(|r| rfc3339(r.time))
    };
    let verified = if report.intact() {
        notes
            .iter()
            .filter(|(_, c)| c.size <= report.checkpointed_size && c.size >= report.first_index)
            .collect::<Vec<_>>()
    } else {
        Vec::new()
    };
    let last_checkpoint = verified.last().map(|(n, c)| CheckpointInfo {
        size: c.size,
        root: B64.encode(c.root),
        covers_until: c.size.checked_sub(1).and_then(time_of),
        signers: n.signatures.iter().map(|s| s.name.clone()).collect(),
    });
    let mut counts = RecordCounts {
        total: report.size,
        first_index: report.first_index,
        unsigned: report.size.saturating_sub(report.checkpointed_size),
        ..RecordCounts::default()
    };
    for r in records {
        match r.body {
            RecordBody::Request(_) => counts.requests += 1,
            RecordBody::Completion(_) => counts.completions += 1,
            RecordBody::Event(_) => counts.events += 1,
        }
    }
    let keys = report
        .starts
        .iter()
        .map(|s| KeyInfo {
            sha256: sha256_hex(s.checkpoint_key.as_bytes()),
            key: s.checkpoint_key.clone(),
            announced_at: s.index,
        })
        .collect();
    let sizes: Vec<u64> = verified.iter().map(|(_, c)| c.size).collect();
    let gaps = if report.intact() {
        gaps(records, report.first_index, &sizes, input.gap_seconds)
    } else {
        Vec::new()
    };
    Summary {
        verdict: if report.intact() {
            "INTACT"
        } else {
            "VIOLATION"
        },
        verdict_line: report.verdict(),
        violation: report.violation.as_ref().map(ToString::to_string),
        attested: input.attested.clone(),
        log: LogFiles {
            dir: dir.display().to_string(),
            files: log_files(dir),
        },
        origin: report.origin.clone(),
        first_record_time: records.first().map(|r| rfc3339(r.time)),
        last_record_time: records.last().map(|r| rfc3339(r.time)),
        records: counts,
        checkpoints: CheckpointCounts {
            stored: notes.len(),
            verified: report.checkpoints_checked,
            pruned: report.checkpoints_pruned,
        },
        last_checkpoint,
        keys,
        runs: runs(records),
        witness: input
            .trusted_checkpoint
            .map(|t| witness_status(t, input.witness_keys, report.intact())),
        gaps,
        incomplete_requests: report.incomplete.clone(),
    }
}

impl Summary {
    /// The summary as text, one fact per line, under the verdict line.
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "log: {}", self.log.dir);
        if let Some(o) = &self.origin {
            let _ = writeln!(s, "origin: {o}");
        }
        for f in &self.log.files {
            let _ = writeln!(
                s,
                "  file {} ({} bytes) sha256 {}",
                f.name, f.bytes, f.sha256
            );
        }
        if let (Some(a), Some(b)) = (&self.first_record_time, &self.last_record_time) {
            let _ = writeln!(s, "time span: {a} to {b}");
        }
        let c = &self.records;
        let _ = writeln!(
            s,
            "records: {} ({} requests, {} completions, {} events; first kept record {}; {} unsigned)",
            c.total, c.requests, c.completions, c.events, c.first_index, c.unsigned
        );
        let k = &self.checkpoints;
        let _ = writeln!(
            s,
            "checkpoints: {} stored, {} verified, {} before the prune point",
            k.stored, k.verified, k.pruned
        );
        if let Some(l) = &self.last_checkpoint {
            let _ = writeln!(
                s,
                "last checkpoint: size {} root {} covering records up to {} signed by {}",
                l.size,
                l.root,
                l.covers_until.as_deref().unwrap_or("-"),
                l.signers.join(", ")
            );
        }
        for key in &self.keys {
            let _ = writeln!(
                s,
                "signing key (record {}): {} sha256 {}",
                key.announced_at, key.key, key.sha256
            );
        }
        for r in &self.runs {
            let _ = writeln!(
                s,
                "run from record {} at {}: version {}, policy {}, model {}, attestation {}{}",
                r.start_index,
                r.started,
                r.software_version,
                r.policy_digest.as_deref().unwrap_or("-"),
                r.model_digest.as_deref().unwrap_or("-"),
                r.attestation,
                r.stopped.as_ref().map_or_else(
                    || ", no stop event".to_owned(),
                    |t| format!(", stopped {t}")
                )
            );
        }
        match &self.witness {
            None => {
                let _ = writeln!(
                    s,
                    "witness: not checked (give --trusted-checkpoint and --witness-key)"
                );
            }
            Some(w) => {
                let _ = writeln!(
                    s,
                    "witness: trusted checkpoint of size {} {}",
                    w.size.map_or_else(|| "?".to_owned(), |n| n.to_string()),
                    if w.contained {
                        "is contained in the log"
                    } else {
                        "FAILED the check"
                    }
                );
                for c in &w.cosignatures {
                    let _ = writeln!(
                        s,
                        "  cosigned by {} ({}) at {}",
                        c.name,
                        c.key_hash,
                        c.time.as_deref().unwrap_or("?")
                    );
                }
                for r in &w.required {
                    let _ = writeln!(
                        s,
                        "  required witness {}: {}",
                        r.name,
                        if r.verified { "verified" } else { "MISSING" }
                    );
                }
            }
        }
        if self.gaps.is_empty() {
            let _ = writeln!(s, "gaps: none");
        }
        for g in &self.gaps {
            let _ = writeln!(
                s,
                "gap: {} to {} ({} s, {} records): {}",
                g.from, g.until, g.seconds, g.records, g.kind
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferno_audit::RECORD_VERSION;

    fn at(index: u64, seconds: i64, body: RecordBody) -> Record {
        Record {
            v: RECORD_VERSION,
            index,
            time: OffsetDateTime::from_unix_timestamp(1_800_000_000 + seconds).expect("time"),
            body,
        }
    }

    fn stop(index: u64, seconds: i64) -> Record {
        at(
            index,
            seconds,
            RecordBody::Event(SecurityEvent::Stopped { reason: "x".into() }),
        )
    }

    fn start(index: u64, seconds: i64) -> Record {
        at(
            index,
            seconds,
            RecordBody::Event(SecurityEvent::Started {
                software_version: "v".into(),
                checkpoint_key: "k".into(),
                evidence: Vec::new(),
            }),
        )
    }

    #[test]
    fn gaps_are_long_waits_restarts_and_the_unsigned_tail() {
        // Run 1: records 0..4 signed at 2 and 4 (the second after 90 s); run 2 starts at 6 and
        // signs run 1's unsigned record 4..5 with its own; 8..9 are never signed.
        let records = vec![
            start(0, 0),
            stop(1, 1),
            stop(2, 2),
            stop(3, 92),
            stop(4, 93),
            stop(5, 94),
            start(6, 3600),
            stop(7, 3601),
            stop(8, 3700),
            stop(9, 3701),
        ];
        let gaps = gaps(&records, 0, &[2, 4, 8], 60);
        let kinds: Vec<(&str, u64, i64)> = gaps
            .iter()
            .map(|g| (g.kind.as_str(), g.records, g.seconds))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("no checkpoint while records were written", 2, 90),
                (
                    "a run ended without signing its last records; the next start signed them",
                    4,
                    3601 - 93
                ),
                ("records after the last checkpoint, not signed", 2, 1),
            ]
        );
        // Under the threshold, and with every record signed: no gap.
        assert!(super::gaps(&records[..4], 0, &[2, 4], 120).is_empty());
    }
}
