//! Parallel weight upload on several streams: straight from the model's page-locked buffers, or
//! through pinned staging buffers.
//!
//! The weights arrive as pieces: a tensor's bytes in the model's host buffers and the device
//! address they go to. First the buffers that hold bf16 pieces are page-locked in place
//! (`cuMemHostRegister`, one thread per contiguous region), so the DMA engines read them directly
//! and no CPU copies them; a region the driver refuses (read-only memory such as the embedded
//! model, or a confidential-computing GPU, whose transfers go through bounce buffers) is staged
//! instead. Pieces are cut into chunks of at most `STAGING_BYTES` of bf16 output; [`workers`]
//! threads take chunks in order, each with its own stream: a registered chunk is queued as one
//! asynchronous copy; any other chunk goes through the worker's pinned staging buffer (allocated
//! on first use): the worker waits until its previous copy has left the buffer, writes the chunk
//! into it (converting f16/f32 to bf16 on the way) and queues the copy. The regions are
//! unregistered once every copy has finished.

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
/// Each copies into write-combined staging at about 4.6 GB/s (measured on the H200 host), so
/// fewer than a dozen cannot keep a PCIe 5 x16 link busy.
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
    /// Time spent page-locking the model's buffers (in parallel) before the copies.
    pub register: Duration,
    /// bf16 bytes copied straight from page-locked model buffers, without staging.
    pub direct_bytes: usize,
}

/// Bytes of one element of `dtype` in the shards.
fn source_width(dtype: DType) -> usize {
    match dtype {
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
struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

impl PinnedBuffer {
    fn new(len: usize) -> Result<Self, UploadError> {
        // SAFETY: a plain cuMemHostAlloc in the current context (the worker bound it); the
        // pointer is owned by the returned value and freed once in Drop.
        let ptr = unsafe { drv::malloc_host(len, sys::CU_MEMHOSTALLOC_WRITECOMBINED) }
            .map_err(|e| UploadError(format!("pinning {len} bytes of staging memory: {e}")))?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
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

/// Bytes of a host page: registered ranges are widened to whole pages.
const HOST_PAGE: usize = 4096;

/// Host memory page-locked for DMA in place (`cuMemHostRegister`) while this value lives.
struct RegisteredRange {
    start: usize,
    end: usize,
}

impl RegisteredRange {
    /// Page-locks the whole pages of `[start, end)`, which must lie in writable memory mapped
    /// for the life of this value.
    fn new(start: usize, end: usize) -> Result<Self, UploadError> {
        // SAFETY: the range is whole pages of live host memory (the model's buffers, which
        // outlive the upload); registration only pins them, and Drop unregisters the same
        // address once.
        unsafe { sys::cuMemHostRegister_v2(start as *mut std::ffi::c_void, end - start, 0) }
            .result()
            .map_err(|e| UploadError(format!("page-locking {} bytes: {e}", end - start)))?;
        Ok(Self { start, end })
    }

    fn holds(&self, data: &[u8]) -> bool {
        let at = data.as_ptr() as usize;
        self.start <= at && at + data.len() <= self.end
    }
}

impl Drop for RegisteredRange {
    fn drop(&mut self) {
        // SAFETY: `start` was registered by `new` and is unregistered only here, after every
        // copy from it finished (the workers synchronised their streams).
        let _ = unsafe { sys::cuMemHostUnregister(self.start as *mut std::ffi::c_void) }.result();
    }
}

/// The page-aligned, merged host ranges that hold the bf16 pieces (the ones copied without
/// conversion), sorted by address.
fn bf16_source_ranges(pieces: &[Piece<'_>]) -> Vec<(usize, usize)> {
    let mut spans: Vec<(usize, usize)> = pieces
        .iter()
        .filter(|p| p.dtype == DType::BF16 && !p.data.is_empty())
        .map(|p| {
            let start = p.data.as_ptr() as usize;
            let end = start + p.data.len();
            (
                start / HOST_PAGE * HOST_PAGE,
                end.div_ceil(HOST_PAGE) * HOST_PAGE,
            )
        })
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Page-locks every range on its own thread; a range the driver refuses is left out (its
/// pieces are staged).
fn register_all(ctx: &Arc<CudaContext>, ranges: &[(usize, usize)]) -> Vec<RegisteredRange> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranges
            .iter()
            .map(|&(start, end)| {
                scope.spawn(move || {
                    ctx.bind_to_thread()
                        .map_err(|e| UploadError(format!("binding the context: {e}")))?;
                    RegisteredRange::new(start, end)
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(Ok(range)) => Some(range),
                Ok(Err(err)) => {
                    tracing::debug!(%err, "weights staged instead of copied in place");
                    None
                }
                Err(_) => None,
            })
            .collect()
    })
}

/// Per-worker totals.
#[derive(Default)]
struct WorkerStats {
    chunks: usize,
    bytes: usize,
    direct_bytes: usize,
    read: Duration,
    wait: Duration,
}

fn worker(
    ctx: &Arc<CudaContext>,
    chunks: &[Piece<'_>],
    registered: &[RegisteredRange],
    next: &AtomicUsize,
    progress: &ProgressBar,
) -> Result<WorkerStats, UploadError> {
    let err = |what: &'static str| {
        move |e: cudarc::driver::DriverError| UploadError(format!("{what}: {e}"))
    };
    ctx.bind_to_thread().map_err(err("binding the context"))?;
    let stream = ctx.new_stream().map_err(err("creating a stream"))?;
    let mut staging: Option<PinnedBuffer> = None;
    let mut stats = WorkerStats::default();
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(chunk) = chunks.get(index) else {
            break;
        };
        if chunk.dtype == DType::BF16 && registered.iter().any(|r| r.holds(chunk.data)) {
            // SAFETY: `chunk.dst` addresses a device allocation with room for the chunk (the
            // uploader allocated each tensor's buffer for its bf16 size); the source is
            // page-locked model memory that stays alive and unchanged until this stream is
            // synchronised below, before the registration is dropped.
            unsafe { drv::memcpy_htod_async(chunk.dst, chunk.data, stream.cu_stream()) }
                .map_err(err("queueing a copy"))?;
            stats.chunks += 1;
            stats.bytes += chunk.data.len();
            stats.direct_bytes += chunk.data.len();
            progress.inc(chunk.data.len() as u64);
            continue;
        }
        let staging = match &mut staging {
            Some(buffer) => buffer,
            None => staging.insert(PinnedBuffer::new(STAGING_BYTES)?),
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
    let registered = register_all(ctx, &bf16_source_ranges(pieces));
    let register = started.elapsed();
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
            .map(|_| scope.spawn(|| worker(ctx, &chunks, &registered, &next, progress)))
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
        stats.direct_bytes += w.direct_bytes;
    }
    stats.register = register;
    // Every stream was synchronised: the pages can be unlocked.
    drop(registered);
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
    fn bf16_sources_merge_into_whole_page_ranges() {
        // A huge-page-aligned buffer, so the expected pages are known.
        let buffer = crate::model::buffer::HostBuffer::public(5 * HOST_PAGE).unwrap();
        let bytes = buffer.as_slice();
        let base = bytes.as_ptr() as usize;
        let f32s = [0u8; 64];
        let piece = |data, dtype| Piece {
            dst: 0,
            dtype,
            data,
        };
        let pieces = [
            piece(&bytes[100..HOST_PAGE + 10], DType::BF16),
            piece(&bytes[HOST_PAGE + 10..2 * HOST_PAGE], DType::BF16),
            piece(&bytes[4 * HOST_PAGE + 1..4 * HOST_PAGE + 2], DType::BF16),
            piece(&f32s, DType::F32),
        ];
        // The two adjacent pieces share one range, the third gets its page, the f32 piece
        // (converted while staged) none.
        assert_eq!(
            bf16_source_ranges(&pieces),
            vec![
                (base, base + 2 * HOST_PAGE),
                (base + 4 * HOST_PAGE, base + 5 * HOST_PAGE)
            ]
        );
    }

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
