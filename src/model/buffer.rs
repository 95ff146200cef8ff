//! Host buffers for a model's files: anonymous memory advised to use transparent huge pages.
//!
//! A model's files are read into memory once (`files.rs`), gigabytes at a time. Faulting that
//! memory in 4 KiB pages costs more than the copy from the page cache itself on a virtual
//! machine (measured in `docs/model-loading.md`), so the buffers are anonymous mappings aligned
//! to and advised for 2 MiB pages: one fault per 2 MiB. Where the kernel has no huge pages the
//! advice is ignored and the buffer behaves like any zeroed allocation.

use memmap2::{Advice, MmapMut};
use rayon::prelude::*;
use zeroize::Zeroize;

/// A transparent huge page, the alignment the buffers are cut at.
const HUGE_PAGE: usize = 2 << 20;

/// Bytes each task zeroes when a secret buffer is dropped.
const ZERO_BLOCK: usize = 16 << 20;

/// A zero-initialised host buffer of a fixed length, optionally wiped when dropped.
pub struct HostBuffer {
    /// The mapping, `HUGE_PAGE` longer than needed so the bytes can start on a huge page;
    /// absent for an empty buffer.
    map: Option<MmapMut>,
    /// Where the bytes start in `map`.
    start: usize,
    len: usize,
    /// Whether the bytes are secret (decrypted weights): overwritten with zeros when dropped.
    secret: bool,
}

impl HostBuffer {
    /// A zeroed buffer of `len` bytes for plaintext that is not secret.
    pub fn public(len: usize) -> std::io::Result<Self> {
        Self::zeroed(len, false)
    }

    /// A zeroed buffer of `len` bytes for secret plaintext (decrypted weights), overwritten
    /// with zeros, by every core, when dropped.
    pub fn secret(len: usize) -> std::io::Result<Self> {
        Self::zeroed(len, true)
    }

    fn zeroed(len: usize, secret: bool) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Self {
                map: None,
                start: 0,
                len,
                secret,
            });
        }
        let padded = len
            .checked_add(HUGE_PAGE)
            .ok_or_else(|| std::io::Error::other("buffer too large"))?;
        let map = MmapMut::map_anon(padded)?;
        let start = map.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
        // Only advice: where transparent huge pages are off, the pages are simply 4 KiB.
        if let Err(err) = map.advise_range(Advice::HugePage, start, len) {
            tracing::debug!(%err, "huge pages not available for a model buffer");
        }
        Ok(Self {
            map: Some(map),
            start,
            len,
            secret,
        })
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        match &self.map {
            Some(map) => &map[self.start..self.start + self.len],
            None => &[],
        }
    }

    /// The contents, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.map {
            Some(map) => &mut map[self.start..self.start + self.len],
            None => &mut [],
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the contents are wiped when the buffer is dropped.
    pub fn is_secret(&self) -> bool {
        self.secret
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.secret {
            // Decrypted weights are gigabytes: zeroed by all cores, or one core would hold
            // start-up for seconds (about 6 s for 16 GB, measured on the 8B-shaped model).
            self.as_mut_slice()
                .par_chunks_mut(ZERO_BLOCK)
                .for_each(|block| block.zeroize());
        }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .field("secret", &self.secret)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_zeroed_on_a_huge_page_and_keep_what_is_written() {
        let mut buffer = HostBuffer::public(3 * HUGE_PAGE + 5).unwrap();
        assert_eq!(buffer.len(), 3 * HUGE_PAGE + 5);
        assert_eq!(buffer.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(buffer.as_slice().iter().all(|&b| b == 0));
        buffer.as_mut_slice()[HUGE_PAGE + 1] = 7;
        assert_eq!(buffer.as_slice()[HUGE_PAGE + 1], 7);
        assert!(!buffer.is_secret());
    }

    #[test]
    fn empty_buffers_have_no_mapping() {
        let mut buffer = HostBuffer::secret(0).unwrap();
        assert!(buffer.is_empty());
        assert!(buffer.as_mut_slice().is_empty());
        assert!(buffer.is_secret());
    }
}
