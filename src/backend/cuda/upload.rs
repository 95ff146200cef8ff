//! Parallel weight upload through pinned staging buffers on several streams.
//!
//! The weights arrive as pieces: a tensor's bytes in the model's in-memory safetensors shards
//! and the device address they go to. Pieces are cut into chunks of at most `STAGING_BYTES` of
//! bf16 output; [`workers`] threads take chunks in order, each with its own pinned (page-locked)
//! staging buffer and stream: a worker waits until its previous copy has left the staging buffer,
//! copies the next chunk into it (converting f16/f32 to bf16 on the way) and queues an
//! asynchronous host-to-device copy, so the CPU copies run on several threads at once and overlap
//! the DMA copies of the others. (Page-locking the model's buffers in place and copying from them
//! directly was measured slower: the registration of 16 GB cost more than the staging saved.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::result as drv;
use cudarc::driver::{CudaContext, sys};
use indicatif::ProgressBar;

use crate::model::DType;
use crate::model::weights::f16_to_f32;

use super::weights::f32_to_bf16;

/// Bytes of one staging buffer.
pub const STAGING_BYTES: usize = 64 << 20;

/// The most upload threads (each with one staging buffer and one stream).
pub const MAX_WORKERS: usize = 12;

/// Upload threads for this host: every core but four (left to the thread that prepares the
/// kernels, KV cache and graphs meanwhile, and to the driver), between 2 and [`MAX_WORKERS`].
/// On the 16-core H200 host 12 threads were no faster than 6 (0.79–0.94 s against 0.80–1.0 s
/// for 16 GB: the staging copies share the host's memory bandwidth); fewer cores get fewer.
pub fn workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get().saturating_sub(4))
        .clamp(2, MAX_WORKERS)
}

/// Bytes of a tensor bound for a device address.
#[derive(Debug, Clone, Copy)]
pub struct Piece<'m> {
    /// Device address of the bf16 output.
    pub dst: u64,
    /// Element type of `data`.
    pub dtype: DType,
    /// The tensor's bytes (little-endian, `dtype` elements).
    pub data: &'m [u8],
}

/// Why an upload failed.
#[derive(Debug, thiserror::Error)]
#[error("weight upload: {0}")]
pub struct UploadError(String);

/// How the upload went, for the start-up timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UploadStats {
    /// bf16 bytes written to the device.
    pub bytes: usize,
    /// Chunks copied.
    pub chunks: usize,
    /// Threads that copied them.
    pub workers: usize,
    /// Wall time of the whole upload.
    pub wall: Duration,
    /// Time the workers spent reading and converting into staging buffers, summed.
    pub read: Duration,
    /// Time the workers spent waiting for their previous copy, summed.
    pub wait: Duration,
}

/// Bytes of one element of `dtype` in the shards.
fn source_width(dtype: DType) -> usize {
    match dtype {
        DType::F8E4M3 => 1,
        DType::BF16 | DType::F16 => 2,
        DType::F32 => 4,
    }
}

/// Cuts pieces into chunks whose bf16 output fits in `staging` bytes (element-aligned).
pub fn chunks<'m>(pieces: &[Piece<'m>], staging: usize) -> Vec<Piece<'m>> {
    let mut out = Vec::new();
    let per_chunk = (staging / 2).max(1);
    for piece in pieces {
        let width = source_width(piece.dtype);
        let elements = piece.data.len() / width;
        let mut first = 0;
        while first < elements {
            let n = per_chunk.min(elements - first);
            out.push(Piece {
                dst: piece.dst + (first * 2) as u64,
                dtype: piece.dtype,
                data: &piece.data[first * width..(first + n) * width],
            });
            first += n;
        }
    }
    out
}

/// Writes a chunk as bf16 into `staging` and returns the bytes written.
pub fn stage(chunk: &Piece<'_>, staging: &mut [u8]) -> usize {
    match chunk.dtype {
        DType::BF16 => {
            staging[..chunk.data.len()].copy_from_slice(chunk.data);
            chunk.data.len()
        }
        DType::F16 => {
            for (out, c) in staging.chunks_exact_mut(2).zip(chunk.data.chunks_exact(2)) {
                let v = f32_to_bf16(f16_to_f32(u16::from_le_bytes([c[0], c[1]])));
                out.copy_from_slice(&v.to_le_bytes());
            }
            chunk.data.len()
        }
        // FP8 values widen exactly (every E4M3 value is a bf16 value); scales are tensors apart.
        DType::F8E4M3 => {
            for (out, &c) in staging.chunks_exact_mut(2).zip(chunk.data) {
                let v = f32_to_bf16(crate::model::fp8::e4m3_to_f32(c));
                out.copy_from_slice(&v.to_le_bytes());
            }
            chunk.data.len() * 2
        }
        DType::F32 => {
            for (out, c) in staging.chunks_exact_mut(2).zip(chunk.data.chunks_exact(4)) {
                let v = f32_to_bf16(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                out.copy_from_slice(&v.to_le_bytes());
            }
            chunk.data.len() / 2
        }
    }
}

/// A page-locked host buffer, freed on drop.
pub(super) struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the value is the only owner of its page-locked allocation, which any thread may read
// and write; `&mut self` is needed to write it.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes of page-locked, write-combined host memory (in the current context).
    pub(super) fn new(len: usize) -> Result<Self, UploadError> {
        // SAFETY: a plain cuMemHostAlloc in the current context (the worker bound it); the
        // pointer is owned by the returned value and freed once in Drop.
        let ptr = unsafe { drv::malloc_host(len, sys::CU_MEMHOSTALLOC_WRITECOMBINED) }
            .map_err(|e| UploadError(format!("pinning {len} bytes of staging memory: {e}")))?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The whole buffer; write it only while no copy from it is in flight.
    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the allocation holds `len` bytes and this value is its only owner; the caller
        // never writes while a copy from it is in flight (it synchronises the stream first).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemHostAlloc and is freed only here, after the worker
        // synchronised the stream that copied from it.
        let _ = unsafe { drv::free_host(self.ptr.cast()) };
    }
}

/// Per-worker totals.
#[derive(Default)]
struct WorkerStats {
    chunks: usize,
    bytes: usize,
    read: Duration,
    wait: Duration,
}

fn worker(
    ctx: &Arc<CudaContext>,
    chunks: &[Piece<'_>],
    next: &AtomicUsize,
    progress: &ProgressBar,
) -> Result<WorkerStats, UploadError> {
    let err = |what: &'static str| {
        move |e: cudarc::driver::DriverError| UploadError(format!("{what}: {e}"))
    };
    ctx.bind_to_thread().map_err(err("binding the context"))?;
    let stream = ctx.new_stream().map_err(err("creating a stream"))?;
    let mut staging = PinnedBuffer::new(STAGING_BYTES)?;
    let mut stats = WorkerStats::default();
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(chunk) = chunks.get(index) else {
            break;
        };
        let t = Instant::now();
        stream.synchronize().map_err(err("waiting for a copy"))?;
        stats.wait += t.elapsed();
        let t = Instant::now();
        let bytes = stage(chunk, staging.as_mut_slice());
        stats.read += t.elapsed();
        // SAFETY: `chunk.dst` addresses a device allocation with room for `bytes` more bytes
        // (the uploader allocated each tensor's buffer for its bf16 size); the staging slice
        // stays alive and unwritten until this stream is synchronised (next iteration or below).
        unsafe {
            drv::memcpy_htod_async(
                chunk.dst,
                &staging.as_mut_slice()[..bytes],
                stream.cu_stream(),
            )
        }
        .map_err(err("queueing a copy"))?;
        stats.chunks += 1;
        stats.bytes += bytes;
        progress.inc(bytes as u64);
    }
    let t = Instant::now();
    stream
        .synchronize()
        .map_err(err("waiting for the last copy"))?;
    stats.wait += t.elapsed();
    Ok(stats)
}

/// Uploads every piece to its device address as bf16, advancing `progress` by the bf16 bytes
/// of each chunk queued (its length and position are reset to this upload first).
pub fn upload(
    ctx: &Arc<CudaContext>,
    pieces: &[Piece<'_>],
    progress: &ProgressBar,
) -> Result<UploadStats, UploadError> {
    let started = Instant::now();
    let chunks = chunks(pieces, STAGING_BYTES);
    progress.set_position(0);
    progress.set_length(
        chunks
            .iter()
            .map(|c| (c.data.len() / source_width(c.dtype) * 2) as u64)
            .sum(),
    );
    let next = AtomicUsize::new(0);
    let workers = workers().min(chunks.len()).max(1);
    let results: Vec<Result<WorkerStats, UploadError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| scope.spawn(|| worker(ctx, &chunks, &next, progress)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(UploadError("an upload thread panicked".into())))
            })
            .collect()
    });
    let mut stats = UploadStats::default();
    for result in results {
        let w = result?;
        stats.bytes += w.bytes;
        stats.chunks += w.chunks;
        stats.read += w.read;
        stats.wait += w.wait;
    }
    stats.wall = started.elapsed();
    stats.workers = workers;
    ctx.bind_to_thread()
        .map_err(|e| UploadError(format!("binding the context: {e}")))?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_threads_stay_within_their_bounds() {
        assert!((2..=MAX_WORKERS).contains(&workers()));
    }

    #[test]
    fn chunks_cover_every_element_once_and_fit_the_staging_buffer() {
        let bf16 = vec![1u8; 10 * 2];
        let f32s = vec![2u8; 7 * 4];
        let pieces = [
            Piece {
                dst: 1000,
                dtype: DType::BF16,
                data: &bf16,
            },
            Piece {
                dst: 5000,
                dtype: DType::F32,
                data: &f32s,
            },
        ];
        // Room for 4 bf16 elements per chunk.
        let out = chunks(&pieces, 8);
        let layout: Vec<(u64, usize)> = out.iter().map(|c| (c.dst, c.data.len())).collect();
        assert_eq!(
            layout,
            vec![(1000, 8), (1008, 8), (1016, 4), (5000, 16), (5008, 12)]
        );
    }

    #[test]
    fn staging_converts_to_bf16() {
        let values = [1.0f32, -2.0, 0.5];
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let chunk = Piece {
            dst: 0,
            dtype: DType::F32,
            data: &data,
        };
        let mut staging = vec![0u8; 16];
        assert_eq!(stage(&chunk, &mut staging), 6);
        let got: Vec<u16> = staging[..6]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, vec![0x3f80, 0xc000, 0x3f00]);
        let halves: Vec<u8> = [0x3c00u16, 0xc000]
            .iter()
            .flat_map(|h| h.to_le_bytes())
            .collect();
        let chunk = Piece {
            dtype: DType::F16,
            data: &halves,
            ..chunk
        };
        assert_eq!(stage(&chunk, &mut staging), 4);
        assert_eq!(&staging[..4], &[0x80, 0x3f, 0x00, 0xc0]);
    }
}
