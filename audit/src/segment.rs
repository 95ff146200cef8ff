//! Segment files: a versioned header followed by chained-CRC frames, one record per frame.
//!
//! Header layout (all integers little-endian):
//! `magic "INFAUDSG" (8) || version u16 || origin_len u16 || segment u64 || first_index u64 ||
//! prev_crc u32 || origin (origin_len bytes, UTF-8) || header_crc u32`, where `header_crc` is the
//! CRC32C of every header byte before it.

use std::path::{Path, PathBuf};

use crate::frame::{read_u32, read_u64};

/// The magic bytes that open every segment file.
pub const SEGMENT_MAGIC: &[u8; 8] = b"INFAUDSG";

/// The segment format version this build writes and reads.
pub const SEGMENT_VERSION: u16 = 1;

/// The file name extension of segment files.
pub const SEGMENT_EXTENSION: &str = "seg";

const FIXED_LEN: usize = 32;

/// The header of one segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The segment's sequence number (0 for the first segment of a log).
    pub segment: u64,
    /// The leaf index of the segment's first record.
    pub first_index: u64,
    /// The CRC chain value the segment's first frame continues from.
    pub prev_crc: u32,
    /// The log's origin (the first line of its checkpoints).
    pub origin: String,
}

/// Why a segment header is unreadable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderFault {
    /// The file is shorter than its header.
    #[error("segment header is truncated")]
    Short,
    /// The magic bytes are wrong.
    #[error("not an audit segment (bad magic)")]
    BadMagic,
    /// The version is not one this build reads.
    #[error("unsupported segment version {0}")]
    Version(u16),
    /// The header CRC does not match.
    #[error("segment header CRC mismatch")]
    BadCrc,
    /// The origin is not UTF-8.
    #[error("segment origin is not UTF-8")]
    BadOrigin,
}

impl SegmentHeader {
    /// Encodes the header.
    pub fn encode(&self) -> Vec<u8> {
        let origin = self.origin.as_bytes();
        let origin_len = u16::try_from(origin.len()).unwrap_or(u16::MAX);
        let mut out = Vec::with_capacity(FIXED_LEN + origin.len() + 4);
        out.extend_from_slice(SEGMENT_MAGIC);
        out.extend_from_slice(&SEGMENT_VERSION.to_le_bytes());
        out.extend_from_slice(&origin_len.to_le_bytes());
        out.extend_from_slice(&self.segment.to_le_bytes());
        out.extend_from_slice(&self.first_index.to_le_bytes());
        out.extend_from_slice(&self.prev_crc.to_le_bytes());
        out.extend_from_slice(&origin[..usize::from(origin_len)]);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a header from the start of a segment file; returns it and its encoded length.
    pub fn decode(buf: &[u8]) -> Result<(Self, usize), HeaderFault> {
        if buf.len() < FIXED_LEN {
            return Err(HeaderFault::Short);
        }
        if &buf[..8] != SEGMENT_MAGIC {
            return Err(HeaderFault::BadMagic);
        }
        let version = u16::from_le_bytes([buf[8], buf[9]]);
        let origin_len = usize::from(u16::from_le_bytes([buf[10], buf[11]]));
        let total = FIXED_LEN + origin_len + 4;
        let stored_crc = read_u32(buf, FIXED_LEN + origin_len).ok_or(HeaderFault::Short)?;
        if crc32c::crc32c(&buf[..FIXED_LEN + origin_len]) != stored_crc {
            return Err(HeaderFault::BadCrc);
        }
        if version != SEGMENT_VERSION {
            return Err(HeaderFault::Version(version));
        }
        let segment = read_u64(buf, 12).ok_or(HeaderFault::Short)?;
        let first_index = read_u64(buf, 20).ok_or(HeaderFault::Short)?;
        let prev_crc = read_u32(buf, 28).ok_or(HeaderFault::Short)?;
        let origin = std::str::from_utf8(&buf[FIXED_LEN..FIXED_LEN + origin_len])
            .map_err(|_| HeaderFault::BadOrigin)?
            .to_owned();
        Ok((
            Self {
                segment,
                first_index,
                prev_crc,
                origin,
            },
            total,
        ))
    }
}

/// The path of segment number `segment` in log directory `dir`.
pub fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:016}.{SEGMENT_EXTENSION}"))
}

/// The segment files of a log directory, as `(segment number, path)` sorted by number.
pub fn list_segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_EXTENSION) {
            continue;
        }
        let number = path
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| s.len() == 16)
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(n) = number {
            out.push((n, path));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_crc() {
        let h = SegmentHeader {
            segment: 3,
            first_index: 1000,
            prev_crc: 0xdead_beef,
            origin: "inferno.local/audit/abc".into(),
        };
        let mut bytes = h.encode();
        let (back, len) = SegmentHeader::decode(&bytes).expect("decodes");
        assert_eq!((back, len), (h, bytes.len()));
        bytes[15] ^= 1;
        assert_eq!(SegmentHeader::decode(&bytes), Err(HeaderFault::BadCrc));
    }
}
