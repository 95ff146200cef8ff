//! Weight bytes copied to the GPU while the model is still being read.
//!
//! From a cold page cache the read of the model is bounded by the disk, and the upload after it
//! (pinned staging, ~20 GB/s) used to add most of a second once the last byte arrived. An
//! [`EarlyUpload`] is the [`BlockSink`] of the model's read: once the GPU has been opened (only
//! after the platform's attestation passed), every block of a `.safetensors` file is copied, by
//! the task that read and hashed (or decrypted) it and from the same buffer, through page-locked
//! staging into a device image of the shards, as long as the read is slow enough for the copies
//! to hide behind it (a disk-bound read; a read from a warm page cache leaves the weights to the
//! staged upload). When the backend is built, each bf16 weight is cut at the blocks' boundaries
//! and every part whose block arrived is copied from the image on the device (a few milliseconds
//! for 16 GB); the image is freed before the KV cache is sized. Everything else (blocks read
//! before the GPU was open, other element types, a model with no room for the image) goes the
//! staged way of `upload.rs`. The image holds checked bytes only, so what reaches the weights is
//! what the digest covers, with no second read.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::result as drv;
use cudarc::driver::{CudaContext, CudaStream};

use crate::model::files::READ_BLOCK;
use crate::model::{BlockSink, DType};

use super::backend::CudaInitError;
use super::memory::DeviceBuffer;
use super::upload::{Piece, PinnedBuffer};

/// Device memory left free beyond the image and the weights when deciding whether the image
/// fits (the context, the kernels and the first step buffers).
const HEADROOM_BYTES: usize = 2 << 30;

/// Blocks are copied early only while the read runs below this rate (bytes per second, since
/// the read began): then the disk bounds the start-up and the copies hide behind it. Faster, the
/// page cache is warm and memory bandwidth is what the read and the copies would share: on the
/// H200 host a warm read of 16 GB (~10 GB/s) took 0.25 s longer with the copies than the staged
/// upload after it saved (`docs/benchmarks.md`, 2026-11-29 fourth session), so the weights are
/// left to that upload.
const COPY_BELOW_BYTES_PER_SEC: f64 = 4e9;

/// The read rate is judged only once this much time has passed since it began.
const RATE_AFTER: Duration = Duration::from_millis(100);

/// Which parts of one file reached the device image, counted per 16 MiB block (the reader's
/// blocks; a sealed model's chunks may be smaller or larger).
#[derive(Debug)]
struct CopiedBlocks {
    len: usize,
    /// Bytes of each block copied so far.
    copied: Vec<AtomicUsize>,
}

impl CopiedBlocks {
    fn new(len: usize) -> Self {
        Self {
            len,
            copied: (0..len.div_ceil(READ_BLOCK))
                .map(|_| AtomicUsize::new(0))
                .collect(),
        }
    }

    /// Records `len` bytes at `offset` as copied (each byte is handed over once).
    fn mark(&self, offset: usize, len: usize) {
        let mut at = offset;
        let end = (offset + len).min(self.len);
        while at < end {
            let block = at / READ_BLOCK;
            let upto = ((block + 1) * READ_BLOCK).min(end);
            self.copied[block].fetch_add(upto - at, Ordering::AcqRel);
            at = upto;
        }
    }

    /// Whether every block overlapping `len` bytes at `offset` was copied whole.
    fn covers(&self, offset: usize, len: usize) -> bool {
        if len == 0 || offset + len > self.len {
            return false;
        }
        (offset / READ_BLOCK..=(offset + len - 1) / READ_BLOCK).all(|b| {
            let size = (self.len - b * READ_BLOCK).min(READ_BLOCK);
            self.copied[b].load(Ordering::Acquire) == size
        })
    }
}

/// One `.safetensors` file in the image.
#[derive(Debug)]
struct ImageFile {
    /// Its byte offset in the image.
    at: usize,
    blocks: CopiedBlocks,
    /// Address of the file's host buffer (known from its first block), 0 until then.
    host_base: AtomicUsize,
}

/// A page-locked buffer of one block and the stream that copies from it to the image.
struct Staging {
    buffer: PinnedBuffer,
    stream: Arc<CudaStream>,
}

impl Staging {
    fn new(context: &Arc<CudaContext>) -> Result<Self, String> {
        Ok(Self {
            buffer: PinnedBuffer::new(READ_BLOCK).map_err(|e| e.to_string())?,
            stream: context
                .new_stream()
                .map_err(|e| format!("creating a stream: {e}"))?,
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The buffer is freed right after: no copy from it may still be in flight.
        let _ = self.stream.synchronize();
    }
}

/// The device image of the model's shards, filled as they are read; see the module docs.
#[derive(Default)]
pub struct EarlyUpload {
    context: OnceLock<Arc<CudaContext>>,
    /// Indexed as the files the read announced; `None` for files that are not shards.
    files: OnceLock<Vec<Option<ImageFile>>>,
    /// Staging buffers not in use (as many are made as blocks are copied at once). Declared
    /// before the image: dropping them waits for their copies into it.
    staging: Mutex<Vec<Staging>>,
    /// The allocation, made at the first block read after the GPU opened; `None` when there was
    /// no room or it failed (everything then goes the staged way).
    image: Mutex<Option<Option<DeviceBuffer>>>,
    /// Set on the first failure: nothing more is copied early.
    stopped: AtomicBool,
    /// When the read began (`begin`).
    began: OnceLock<Instant>,
    /// Bytes the read handed over so far, copied or not.
    seen: AtomicUsize,
    bytes: AtomicUsize,
    copy_nanos: AtomicU64,
    placed: AtomicUsize,
}

impl std::fmt::Debug for EarlyUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyUpload")
            .field("device_open", &self.context.get().is_some())
            .field("bytes", &self.bytes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What an early upload achieved, for the start-up log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EarlyStats {
    /// Shard bytes copied to the device image while the model was read.
    pub bytes: usize,
    /// Time the reading tasks spent copying them, summed.
    pub copying: Duration,
    /// Weight bytes placed from the image on the device when the backend was built.
    pub placed: usize,
}

impl EarlyUpload {
    /// A sink that copies nothing until [`EarlyUpload::device_open`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The GPU is open (and may be used: the platform's attestation passed): blocks read from
    /// now on are copied to it. Later calls change nothing.
    pub fn device_open(&self, context: Arc<CudaContext>) {
        let _ = self.context.set(context);
    }

    /// What was copied so far.
    pub fn stats(&self) -> EarlyStats {
        EarlyStats {
            bytes: self.bytes.load(Ordering::Relaxed),
            copying: Duration::from_nanos(self.copy_nanos.load(Ordering::Relaxed)),
            placed: self.placed.load(Ordering::Relaxed),
        }
    }

    /// Cuts `piece` at the image's block boundaries into parts, each with the device address of
    /// its copy in the image when every block it spans arrived (whole when its bytes are not in
    /// a shard's host buffer or the cut would split an element).
    fn split<'m>(&self, piece: Piece<'m>) -> Vec<(Piece<'m>, Option<u64>)> {
        let image = self.image.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(Some(image)), Some(files)) = (image.as_ref(), self.files.get()) else {
            return vec![(piece, None)];
        };
        let start = piece.data.as_ptr() as usize;
        let found = files.iter().flatten().find_map(|file| {
            let host = file.host_base.load(Ordering::Acquire);
            let offset = start.checked_sub(host).filter(|_| host != 0)?;
            (offset + piece.data.len() <= file.blocks.len).then_some((file, offset))
        });
        let Some((file, offset)) = found else {
            return vec![(piece, None)];
        };
        let cuts_elements = offset % 2 != 0;
        let mut parts = Vec::new();
        let mut at = 0;
        while at < piece.data.len() {
            let end = if cuts_elements {
                piece.data.len()
            } else {
                ((offset + at) / READ_BLOCK + 1) * READ_BLOCK - offset
            }
            .min(piece.data.len());
            let part = Piece {
                dst: piece.dst + at as u64,
                dtype: piece.dtype,
                data: &piece.data[at..end],
            };
            let source = file
                .blocks
                .covers(offset + at, end - at)
                .then(|| image.ptr() + (file.at + offset + at) as u64);
            parts.push((part, source));
            at = end;
        }
        parts
    }

    /// Copies every bf16 piece whose bytes are all in the image to its weight on `stream`
    /// (device to device), waits for the copies and frees the image (in the current context);
    /// returns the pieces left for the staged upload (the bytes placed are in [`Self::stats`]).
    pub(super) fn place<'m>(
        &self,
        pieces: Vec<Piece<'m>>,
        stream: &CudaStream,
    ) -> Result<Vec<Piece<'m>>, CudaInitError> {
        // Every queued copy into the image has landed once its staging stream is synchronised.
        let staging = std::mem::take(&mut *self.staging.lock().unwrap_or_else(|e| e.into_inner()));
        for buffer in &staging {
            buffer
                .stream
                .synchronize()
                .map_err(|e| CudaInitError::Weights(format!("copying while reading: {e}")))?;
        }
        drop(staging);
        let mut rest = Vec::with_capacity(pieces.len());
        let mut placed = 0;
        let parts = pieces.into_iter().flat_map(|piece| match piece.dtype {
            DType::BF16 => self.split(piece),
            DType::F16 | DType::F32 => vec![(piece, None)],
        });
        for (piece, source) in parts {
            let Some(source) = source else {
                rest.push(piece);
                continue;
            };
            // SAFETY: `source` addresses `piece.data.len()` bytes of the image (every block of
            // them was copied, checked by `split`) and `piece.dst` a weight allocated for
            // the piece's bf16 bytes, which for bf16 are as many; both stay allocated until the
            // stream is synchronised below.
            unsafe {
                drv::memcpy_dtod_async(piece.dst, source, piece.data.len(), stream.cu_stream())
            }
            .map_err(|e| CudaInitError::Weights(format!("placing a weight from the image: {e}")))?;
            placed += piece.data.len();
        }
        stream
            .synchronize()
            .map_err(|e| CudaInitError::Weights(format!("placing the weights: {e}")))?;
        *self.image.lock().unwrap_or_else(|e| e.into_inner()) = Some(None);
        self.placed.fetch_add(placed, Ordering::Relaxed);
        Ok(rest)
    }

    /// Allocates the image on the first call when there is room; its address, if any.
    fn image_ptr(&self, context: &Arc<CudaContext>) -> Option<u64> {
        let mut image = self.image.lock().unwrap_or_else(|e| e.into_inner());
        if image.is_none() {
            let total: usize = self.files.get().map_or(0, |files| {
                files.iter().flatten().map(|f| f.blocks.len).sum()
            });
            *image = Some(allocate_image(context, total));
        }
        image.as_ref()?.as_ref().map(DeviceBuffer::ptr)
    }

    /// Whether the read, having handed over `seen` bytes, runs faster than early copies pay.
    fn read_is_fast(&self, seen: usize) -> bool {
        let Some(began) = self.began.get() else {
            return false;
        };
        let elapsed = began.elapsed();
        elapsed > RATE_AFTER && seen as f64 / elapsed.as_secs_f64() > COPY_BELOW_BYTES_PER_SEC
    }

    /// Queues the copy of `bytes` to `dst` through a staging buffer (a block at a time), so the
    /// reading task only copies into page-locked memory and goes on reading.
    fn copy(&self, context: &Arc<CudaContext>, dst: u64, bytes: &[u8]) -> Result<(), String> {
        let free = self.staging.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut staging = match free {
            Some(staging) => staging,
            None => Staging::new(context)?,
        };
        for (i, part) in bytes.chunks(READ_BLOCK).enumerate() {
            staging
                .stream
                .synchronize()
                .map_err(|e| format!("waiting for a copy: {e}"))?;
            let staged = &mut staging.buffer.as_mut_slice()[..part.len()];
            staged.copy_from_slice(part);
            // SAFETY: `dst + i * READ_BLOCK` and the part's length lie in the image (the caller
            // checked the block against its file's place), which is freed only after every
            // staging stream was synchronised (`place`); the staging buffer is not written again
            // before this stream is synchronised (above, or when it is dropped).
            unsafe {
                drv::memcpy_htod_async(
                    dst + (i * READ_BLOCK) as u64,
                    &*staged,
                    staging.stream.cu_stream(),
                )
            }
            .map_err(|e| format!("queueing a copy: {e}"))?;
        }
        self.staging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(staging);
        Ok(())
    }

    fn stop(&self, why: String) {
        if !self.stopped.swap(true, Ordering::Relaxed) {
            tracing::warn!(%why, "early weight copies stopped; the rest goes the staged way");
        }
    }
}

/// An image of `total` bytes when the device has room for it and the weights beside it.
fn allocate_image(context: &Arc<CudaContext>, total: usize) -> Option<DeviceBuffer> {
    if total == 0 || context.bind_to_thread().is_err() {
        return None;
    }
    let free = drv::mem_get_info().map(|(free, _)| free).unwrap_or(0);
    if free < 2 * total + HEADROOM_BYTES {
        tracing::info!(
            free_bytes = free,
            shard_bytes = total,
            "no room for an early copy of the shards beside the weights; uploading after the read"
        );
        return None;
    }
    DeviceBuffer::new(total)
        .inspect_err(|e| tracing::warn!(error = %e, "allocating the early image failed"))
        .ok()
}

impl BlockSink for EarlyUpload {
    fn begin(&self, files: &[(&str, usize)]) {
        let mut at = 0;
        let files = files
            .iter()
            .map(|(name, len)| {
                name.ends_with(".safetensors").then(|| {
                    let file = ImageFile {
                        at,
                        blocks: CopiedBlocks::new(*len),
                        host_base: AtomicUsize::new(0),
                    };
                    at += len;
                    file
                })
            })
            .collect();
        let _ = self.files.set(files);
        let _ = self.began.set(Instant::now());
    }

    fn block(&self, file: usize, offset: usize, bytes: &[u8]) {
        let seen = self.seen.fetch_add(bytes.len(), Ordering::Relaxed) + bytes.len();
        let Some(context) = self.context.get() else {
            return;
        };
        if self.read_is_fast(seen) {
            return;
        }
        let Some(Some(target)) = self.files.get().and_then(|files| files.get(file)) else {
            return;
        };
        if self.stopped.load(Ordering::Relaxed) || offset + bytes.len() > target.blocks.len {
            return;
        }
        let _ = target.host_base.compare_exchange(
            0,
            bytes.as_ptr() as usize - offset,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        let Some(base) = self.image_ptr(context) else {
            return;
        };
        let started = Instant::now();
        if let Err(e) = context.bind_to_thread() {
            return self.stop(format!("binding the context: {e}"));
        }
        if let Err(e) = self.copy(context, base + (target.at + offset) as u64, bytes) {
            return self.stop(e);
        }
        target.blocks.mark(offset, bytes.len());
        self.bytes.fetch_add(bytes.len(), Ordering::Relaxed);
        self.copy_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_counts_as_copied_only_when_every_block_it_spans_was() {
        let blocks = CopiedBlocks::new(3 * READ_BLOCK + 10);
        assert!(!blocks.covers(0, 1));
        blocks.mark(0, READ_BLOCK);
        blocks.mark(2 * READ_BLOCK, READ_BLOCK);
        assert!(blocks.covers(0, READ_BLOCK));
        assert!(
            !blocks.covers(READ_BLOCK - 2, 4),
            "spans block 1, not copied"
        );
        assert!(blocks.covers(2 * READ_BLOCK + 5, READ_BLOCK - 5));
        blocks.mark(READ_BLOCK, READ_BLOCK);
        assert!(blocks.covers(0, 3 * READ_BLOCK));
        assert!(
            !blocks.covers(0, 3 * READ_BLOCK + 1),
            "the last block was not copied"
        );
        blocks.mark(3 * READ_BLOCK, 10);
        assert!(blocks.covers(0, 3 * READ_BLOCK + 10));
        assert!(
            !blocks.covers(0, 3 * READ_BLOCK + 11),
            "past the end of the file"
        );
        assert!(!blocks.covers(5, 0), "an empty range is never resident");
    }

    #[test]
    fn pieces_of_other_sizes_complete_a_block_only_together() {
        // A sealed model's chunks: 5 MiB pieces, one straddling the first block's end.
        let chunk = 5 << 20;
        let blocks = CopiedBlocks::new(2 * READ_BLOCK);
        for i in 0..3 {
            blocks.mark(i * chunk, chunk);
        }
        assert!(!blocks.covers(0, 1), "15 of 16 MiB copied");
        blocks.mark(3 * chunk, chunk);
        assert!(blocks.covers(0, READ_BLOCK));
        assert!(!blocks.covers(READ_BLOCK, 1));
        for i in 4..7 {
            blocks.mark(i * chunk, chunk);
        }
        assert!(
            blocks.covers(0, 2 * READ_BLOCK),
            "the last piece is clipped at the end"
        );
    }

    #[test]
    fn without_an_open_device_blocks_are_only_announced() {
        let early = EarlyUpload::new();
        early.begin(&[("config.json", 2), ("a.safetensors", 100)]);
        early.block(1, 0, &[0u8; 100]);
        assert_eq!(early.stats(), EarlyStats::default());
        let data = [0u8; 4];
        let piece = Piece {
            dst: 0,
            dtype: DType::BF16,
            data: &data,
        };
        let parts = early.split(piece);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].1, None, "without an image nothing is resident");
    }
}
