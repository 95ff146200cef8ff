//! Read-only scanning of a log directory: segments, the checkpoints file and the prune anchor.
//! Shared by recovery (at open), the verifier and the CLI.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

use crate::error::AuditError;
use crate::frame::{FrameFault, decode_frame};
use crate::merkle::{Frontier, Hash, leaf_hash};
use crate::segment::{HeaderFault, SegmentHeader, list_segments};

/// The name of the checkpoints file in a log directory.
pub const CHECKPOINTS_FILE: &str = "checkpoints.log";
/// The magic bytes that open the checkpoints file.
pub const CHECKPOINTS_MAGIC: &[u8; 8] = b"INFAUDCP";
/// The checkpoints file format version.
pub const CHECKPOINTS_VERSION: u16 = 1;
/// The length of the checkpoints file header.
pub const CHECKPOINTS_HEADER_LEN: usize = 16;
/// The name of the prune anchor file in a log directory.
pub const ANCHOR_FILE: &str = "prune-anchor.json";
/// The prune anchor format version.
pub const ANCHOR_VERSION: u32 = 1;

/// The checkpoints file header: magic, version u16 LE, two zero bytes, CRC32C of those 12 bytes.
pub fn checkpoints_header() -> Vec<u8> {
    let mut h = CHECKPOINTS_MAGIC.to_vec();
    h.extend_from_slice(&CHECKPOINTS_VERSION.to_le_bytes());
    h.extend_from_slice(&[0, 0]);
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// A position in a log directory: a file and a byte offset in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub file: PathBuf,
    /// The byte offset.
    pub offset: u64,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.file.file_name().unwrap_or(self.file.as_os_str());
        write!(f, "{} offset {}", name.to_string_lossy(), self.offset)
    }
}

/// What a pruned log keeps in place of its removed segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneAnchor {
    /// The anchor format version ([`ANCHOR_VERSION`]).
    pub version: u32,
    /// The log's origin.
    pub origin: String,
    /// The leaf index of the first kept record.
    pub first_index: u64,
    /// The number of the first kept segment.
    pub first_segment: u64,
    /// The CRC chain value the first kept segment continues from.
    pub prev_crc: u32,
    /// Base64 roots of the maximal perfect subtrees of the pruned leaves, largest first.
    pub frontier: Vec<String>,
    /// The checkpoint verifier key in effect at `first_index` (from the last pruned start event).
    pub checkpoint_key: Option<String>,
}

impl PruneAnchor {
    /// The frontier of the pruned leaves, if well-formed.
    pub fn frontier(&self) -> Option<Frontier> {
        let hashes: Option<Vec<Hash>> = self
            .frontier
            .iter()
            .map(|h| B64.decode(h).ok().and_then(|b| b.try_into().ok()))
            .collect();
        Frontier::from_parts(self.first_index, hashes?)
    }
}

/// What kind of damage a scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// A bad frame.
    Frame(FrameFault),
    /// A bad segment header.
    Header(HeaderFault),
    /// Segments out of sequence, or a header inconsistent with the chain.
    Sequence(String),
    /// A frame whose payload the caller rejected (e.g. not a valid record).
    Record(String),
    /// A file could not be read.
    Io(String),
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Frame(x) => write!(f, "{x}"),
            Self::Header(x) => write!(f, "{x}"),
            Self::Sequence(x) | Self::Record(x) => f.write_str(x),
            Self::Io(x) => write!(f, "read error: {x}"),
        }
    }
}

/// The first damage a scan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanFault {
    /// Where.
    pub location: Location,
    /// The leaf index the damaged frame would have had.
    pub index: u64,
    /// What.
    pub kind: FaultKind,
    /// Whether the damage looks like a torn write at the very end of the log (the last frame or
    /// header of the last segment, running to the end of the file).
    pub torn_tail: bool,
}

/// One segment as scanned.
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    /// The segment file.
    pub path: PathBuf,
    /// Its header (`None` if the header itself is torn).
    pub header: Option<SegmentHeader>,
    /// The length of its valid prefix (header and intact frames).
    pub valid_len: u64,
    /// Its length on disk.
    pub file_len: u64,
}

/// A scanned log.
#[derive(Debug, Clone, Default)]
pub struct ScannedLog {
    /// The log's origin, from the first segment header or the anchor.
    pub origin: Option<String>,
    /// The prune anchor, if the log was pruned.
    pub anchor: Option<PruneAnchor>,
    /// The pruned prefix (empty if never pruned).
    pub prefix: Frontier,
    /// Hashes of the intact kept leaves, in order, starting at `prefix.size()`.
    pub leaves: Vec<Hash>,
    /// The segments, in order.
    pub segments: Vec<SegmentInfo>,
    /// The CRC chain value after the last intact frame.
    pub chain: u32,
    /// The first damage, if any; scanning stops there.
    pub fault: Option<ScanFault>,
}

impl ScannedLog {
    /// The number of intact leaves (pruned and kept).
    pub fn size(&self) -> u64 {
        self.prefix.size() + self.leaves.len() as u64
    }
}

/// Whether bytes `rest` (from a bad frame to the end of the file) look like a torn final
/// write: a frame cut short, or one whose bytes end in the zero fill a crash leaves where data
/// was allocated but never written. Stored payloads never end in a zero byte.
fn looks_torn(rest: &[u8], fault: FrameFault) -> bool {
    match fault {
        FrameFault::Short => true,
        FrameFault::BadLength | FrameFault::BadCrc => rest.last() == Some(&0),
    }
}

/// Reads the prune anchor of `dir`, if present.
pub fn read_anchor(dir: &Path) -> Result<Option<PruneAnchor>, AuditError> {
    let path = dir.join(ANCHOR_FILE);
    let corrupt = |reason: String| AuditError::Corrupt {
        location: path.display().to_string(),
        reason,
    };
    match std::fs::read(&path) {
        Ok(bytes) => {
            let a: PruneAnchor =
                serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
            if a.version != ANCHOR_VERSION {
                return Err(corrupt(format!("unsupported version {}", a.version)));
            }
            Ok(Some(a))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(AuditError::io(format!("reading {}", path.display()), e)),
    }
}

/// Scans every segment of `dir`, calling `on_record(index, location, payload)` for each intact
/// frame; an `Err` from it is reported as a [`FaultKind::Record`] fault at that frame.
pub fn scan_segments(
    dir: &Path,
    mut on_record: impl FnMut(u64, &Location, &[u8]) -> Result<(), String>,
) -> Result<ScannedLog, AuditError> {
    let mut log = ScannedLog::default();
    let anchor = read_anchor(dir)?;
    if let Some(a) = &anchor {
        log.prefix = a.frontier().ok_or_else(|| AuditError::Corrupt {
            location: dir.join(ANCHOR_FILE).display().to_string(),
            reason: "frontier does not match first_index".into(),
        })?;
        log.chain = a.prev_crc;
        log.origin = Some(a.origin.clone());
    }
    let segments =
        list_segments(dir).map_err(|e| AuditError::io(format!("listing {}", dir.display()), e))?;
    // Segments below the anchor are leftovers of an interrupted prune.
    let first_kept = anchor.as_ref().map_or(0, |a| a.first_segment);
    log.anchor = anchor;
    let segments: Vec<_> = segments
        .into_iter()
        .filter(|(n, _)| *n >= first_kept)
        .collect();
    let count = segments.len();
    for (expected_segment, (pos, (number, path))) in
        (first_kept..).zip(segments.into_iter().enumerate())
    {
        let is_last = pos + 1 == count;
        let fault_at = |log: &ScannedLog, offset: u64, kind: FaultKind, torn: bool| ScanFault {
            location: Location {
                file: path.clone(),
                offset,
            },
            index: log.size(),
            kind,
            torn_tail: torn && is_last,
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                log.fault = Some(fault_at(&log, 0, FaultKind::Io(e.to_string()), false));
                return Ok(log);
            }
        };
        let mut info = SegmentInfo {
            path: path.clone(),
            header: None,
            valid_len: 0,
            file_len: bytes.len() as u64,
        };
        if number != expected_segment {
            let msg = format!("expected segment {expected_segment}, found segment {number}");
            log.fault = Some(fault_at(&log, 0, FaultKind::Sequence(msg), false));
            log.segments.push(info);
            return Ok(log);
        }
        let (header, mut at) = match SegmentHeader::decode(&bytes) {
            Ok(h) => h,
            Err(e) => {
                let torn = matches!(e, HeaderFault::Short)
                    || (e == HeaderFault::BadCrc && bytes.iter().skip(8).all(|b| *b == 0));
                log.fault = Some(fault_at(&log, 0, FaultKind::Header(e), torn));
                log.segments.push(info);
                return Ok(log);
            }
        };
        let sequence_problem = if header.segment != number {
            Some(format!("header names segment {}", header.segment))
        } else if header.first_index != log.size() {
            Some(format!(
                "header says first index {}, expected {}",
                header.first_index,
                log.size()
            ))
        } else if header.prev_crc != log.chain {
            Some("header CRC chain value does not continue the previous segment".to_owned())
        } else if log.origin.as_ref().is_some_and(|o| o != &header.origin) {
            Some(format!(
                "header origin {:?} differs from the log's",
                header.origin
            ))
        } else {
            None
        };
        if let Some(msg) = sequence_problem {
            log.fault = Some(fault_at(&log, 0, FaultKind::Sequence(msg), false));
            log.segments.push(info);
            return Ok(log);
        }
        log.origin.get_or_insert_with(|| header.origin.clone());
        info.header = Some(header);
        while at < bytes.len() {
            let rest = &bytes[at..];
            let frame = match decode_frame(log.chain, rest) {
                Ok(f) => f,
                Err(e) => {
                    let torn = looks_torn(rest, e);
                    log.fault = Some(fault_at(&log, at as u64, FaultKind::Frame(e), torn));
                    break;
                }
            };
            let location = Location {
                file: path.clone(),
                offset: at as u64,
            };
            if let Err(msg) = on_record(log.size(), &location, frame.payload) {
                log.fault = Some(fault_at(&log, at as u64, FaultKind::Record(msg), false));
                break;
            }
            log.leaves.push(leaf_hash(frame.payload));
            log.chain = frame.crc;
            at += frame.encoded_len;
        }
        info.valid_len = at as u64;
        log.segments.push(info);
        if log.fault.is_some() {
            return Ok(log);
        }
    }
    Ok(log)
}

/// One checkpoint read from the checkpoints file.
#[derive(Debug, Clone)]
pub struct StoredCheckpoint {
    /// Where its frame starts.
    pub location: Location,
    /// The signed note text.
    pub note: String,
}

/// The scanned checkpoints file.
#[derive(Debug, Clone, Default)]
pub struct CheckpointsFile {
    /// The intact checkpoints, in order.
    pub checkpoints: Vec<StoredCheckpoint>,
    /// The length of the valid prefix.
    pub valid_len: u64,
    /// The file's length.
    pub file_len: u64,
    /// The CRC chain value after the last intact frame.
    pub chain: u32,
    /// The first damage, if any (`index` counts checkpoints).
    pub fault: Option<ScanFault>,
}

/// Reads the checkpoints file of `dir` (an absent file reads as empty).
pub fn read_checkpoints(dir: &Path) -> Result<CheckpointsFile, AuditError> {
    let path = dir.join(CHECKPOINTS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(CheckpointsFile::default()),
        Err(e) => return Err(AuditError::io(format!("reading {}", path.display()), e)),
    };
    let mut out = CheckpointsFile {
        file_len: bytes.len() as u64,
        ..CheckpointsFile::default()
    };
    let fault = |offset: usize, index: usize, kind: FaultKind, torn: bool| ScanFault {
        location: Location {
            file: path.clone(),
            offset: offset as u64,
        },
        index: index as u64,
        kind,
        torn_tail: torn,
    };
    let header = checkpoints_header();
    if bytes.get(..CHECKPOINTS_HEADER_LEN) != Some(&header[..]) {
        let torn = bytes.len() < CHECKPOINTS_HEADER_LEN && header.starts_with(&bytes);
        let kind = FaultKind::Header(if torn {
            HeaderFault::Short
        } else {
            HeaderFault::BadMagic
        });
        out.fault = Some(fault(0, 0, kind, torn));
        return Ok(out);
    }
    let mut at = CHECKPOINTS_HEADER_LEN;
    while at < bytes.len() {
        let rest = &bytes[at..];
        match decode_frame(out.chain, rest) {
            Ok(frame) => match std::str::from_utf8(frame.payload) {
                Ok(note) => {
                    out.checkpoints.push(StoredCheckpoint {
                        location: Location {
                            file: path.clone(),
                            offset: at as u64,
                        },
                        note: note.to_owned(),
                    });
                    out.chain = frame.crc;
                    at += frame.encoded_len;
                }
                Err(_) => {
                    let kind = FaultKind::Record("checkpoint is not UTF-8".into());
                    out.fault = Some(fault(at, out.checkpoints.len(), kind, false));
                    break;
                }
            },
            Err(e) => {
                let torn = looks_torn(rest, e);
                out.fault = Some(fault(at, out.checkpoints.len(), FaultKind::Frame(e), torn));
                break;
            }
        }
    }
    out.valid_len = at as u64;
    Ok(out)
}
