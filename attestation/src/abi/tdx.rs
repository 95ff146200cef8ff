//! Intel TDX DCAP quotes: recognising the header. Full parsing and verification are done by
//! `dcap-qvl` in [`crate::verify::tdx`].

/// The TEE type of a TDX quote.
pub const TEE_TYPE_TDX: u32 = 0x81;

/// Quote header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuoteHeader {
    /// Quote format version (4 or 5 for TDX).
    pub version: u16,
    /// Attestation key type (2 = ECDSA P-256).
    pub attestation_key_type: u16,
    /// TEE type (0x81 = TDX).
    pub tee_type: u32,
}

/// Reads the 48-byte quote header's leading fields, if there are enough bytes.
pub fn header(bytes: &[u8]) -> Option<QuoteHeader> {
    let version = u16::from_le_bytes(bytes.get(0..2)?.try_into().ok()?);
    let attestation_key_type = u16::from_le_bytes(bytes.get(2..4)?.try_into().ok()?);
    let tee_type = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    bytes.get(..48)?;
    Some(QuoteHeader {
        version,
        attestation_key_type,
        tee_type,
    })
}

/// Whether the bytes start like a TDX quote of version 4 or 5.
pub fn looks_like_quote(bytes: &[u8]) -> bool {
    header(bytes).is_some_and(|h| matches!(h.version, 4 | 5) && h.tee_type == TEE_TYPE_TDX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_tdx_headers_only() {
        let mut q = vec![0u8; 64];
        q[0] = 4;
        q[2] = 2;
        q[4] = 0x81;
        assert!(looks_like_quote(&q));
        q[0] = 3;
        assert!(!looks_like_quote(&q));
        assert!(!looks_like_quote(&q[..10]));
    }
}
