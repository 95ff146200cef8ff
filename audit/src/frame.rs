//! Record framing: `len: u32 LE || crc: u32 LE || payload`, where `crc` is CRC32C chained over
//! the previous frame's CRC: `crc = crc32c_append(prev_crc, len_le || payload)`.

/// Bytes of a frame header (length and CRC).
pub const FRAME_HEADER_LEN: usize = 8;

/// The largest payload a frame may carry (16 MiB); longer lengths are treated as corruption.
pub const MAX_PAYLOAD_LEN: u32 = 16 << 20;

/// The chained CRC of a frame whose payload is `payload`, following a frame whose CRC was `prev`.
pub fn chained_crc(prev: u32, payload: &[u8]) -> u32 {
    let len = u32::try_from(payload.len())
        .unwrap_or(u32::MAX)
        .to_le_bytes();
    crc32c::crc32c_append(crc32c::crc32c_append(prev, &len), payload)
}

/// Appends one frame to `out` and returns its CRC (the chain value for the next frame).
pub fn encode_frame(prev: u32, payload: &[u8], out: &mut Vec<u8>) -> u32 {
    let crc = chained_crc(prev, payload);
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    crc
}

/// Why the bytes at some offset are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameFault {
    /// Fewer bytes remain than the frame header or its declared payload length needs.
    Short,
    /// The declared length exceeds [`MAX_PAYLOAD_LEN`].
    BadLength,
    /// The CRC does not match the chain.
    BadCrc,
}

impl std::fmt::Display for FrameFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Short => "short frame",
            Self::BadLength => "frame length out of range",
            Self::BadCrc => "CRC mismatch",
        })
    }
}

/// One frame decoded from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The payload bytes.
    pub payload: &'a [u8],
    /// The frame's chained CRC.
    pub crc: u32,
    /// The total encoded length (header and payload).
    pub encoded_len: usize,
}

/// Decodes the frame at the start of `buf`, checking its CRC against the chain value `prev`.
pub fn decode_frame(prev: u32, buf: &[u8]) -> Result<Frame<'_>, FrameFault> {
    let (Some(len), Some(crc)) = (read_u32(buf, 0), read_u32(buf, 4)) else {
        return Err(FrameFault::Short);
    };
    if len > MAX_PAYLOAD_LEN {
        return Err(FrameFault::BadLength);
    }
    let end = FRAME_HEADER_LEN + len as usize;
    let Some(payload) = buf.get(FRAME_HEADER_LEN..end) else {
        return Err(FrameFault::Short);
    };
    if chained_crc(prev, payload) != crc {
        return Err(FrameFault::BadCrc);
    }
    Ok(Frame {
        payload,
        crc,
        encoded_len: end,
    })
}

/// Reads a little-endian `u32` at `at`, if the buffer is long enough.
pub fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

/// Reads a little-endian `u64` at `at`, if the buffer is long enough.
pub fn read_u64(buf: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; 8] = buf.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_chain() {
        let mut buf = Vec::new();
        let c1 = encode_frame(7, b"hello", &mut buf);
        let c2 = encode_frame(c1, b"world!", &mut buf);
        let f1 = decode_frame(7, &buf).expect("first frame");
        assert_eq!(f1.payload, b"hello");
        let f2 = decode_frame(f1.crc, &buf[f1.encoded_len..]).expect("second frame");
        assert_eq!((f2.payload, f2.crc), (&b"world!"[..], c2));
        // The same frame does not verify under another chain value.
        assert_eq!(decode_frame(8, &buf), Err(FrameFault::BadCrc));
        assert_eq!(decode_frame(7, &buf[..10]), Err(FrameFault::Short));
    }
}
