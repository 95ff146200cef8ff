//! Big-endian cursor over TPM marshalled structures that names the field on truncation.

use super::error::TpmError;

/// Reads TPM wire types from a byte slice; each read names the structure field it decodes.
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    structure: &'static str,
}

impl<'a> Reader<'a> {
    /// Starts reading `data`, which holds a `structure` (named in errors).
    pub(crate) fn new(data: &'a [u8], structure: &'static str) -> Self {
        Self {
            data,
            pos: 0,
            structure,
        }
    }

    /// Takes `len` raw bytes.
    pub(crate) fn bytes(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], TpmError> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|end| *end <= self.data.len())
            .ok_or(TpmError::Truncated {
                structure: self.structure,
                field,
            })?;
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// Reads a `u8`.
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, TpmError> {
        Ok(self.bytes(1, field)?[0])
    }

    /// Reads a big-endian `u16`.
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, TpmError> {
        let b = self.bytes(2, field)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Reads a big-endian `u32`.
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, TpmError> {
        let b = self.bytes(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads a big-endian `u64`.
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, TpmError> {
        let b = self.bytes(8, field)?;
        let mut arr = [0u8; 8];
        arr.copy_from_slice(b);
        Ok(u64::from_be_bytes(arr))
    }

    /// Reads a TPM2B (u16 size followed by that many bytes).
    pub(crate) fn tpm2b(&mut self, field: &'static str) -> Result<&'a [u8], TpmError> {
        let len = self.u16(field)?;
        self.bytes(usize::from(len), field)
    }

    /// Fails unless every byte was consumed.
    pub(crate) fn finish(self) -> Result<(), TpmError> {
        if self.pos == self.data.len() {
            Ok(())
        } else {
            Err(TpmError::TrailingBytes {
                structure: self.structure,
                count: self.data.len() - self.pos,
            })
        }
    }
}

impl Reader<'_> {
    /// Reads a little-endian `u16` (TCG event logs are little-endian).
    pub(crate) fn u16_le(&mut self, field: &'static str) -> Result<u16, TpmError> {
        let b = self.bytes(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    /// Reads a little-endian `u32`.
    pub(crate) fn u32_le(&mut self, field: &'static str) -> Result<u32, TpmError> {
        let b = self.bytes(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Whether every byte was consumed.
    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// Byte offset of the cursor.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }
}
