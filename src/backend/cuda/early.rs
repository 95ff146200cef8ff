//! Weight bytes copied to the GPU while the model is still being read.
//!
//! From a cold page cache the read of the model is bounded by the disk. Everything the device
//! needs besides the weights' contents (the weights' buffers, the KV cache, the step buffers,
//! the product paths and the decode graphs) follows from `config.json` alone, so `inferno serve`
//! prepares it while the model is read (`OpenedDevice::prepare_backend`, once the platform's
//! attestation passed). An [`EarlyUpload`] is the [`BlockSink`] of that read: once it knows where
//! each tensor goes ([`EarlyUpload::target`]) and a shard's header (from the shard's first block),
//! every block of the shard is copied by the task that read and hashed (or decrypted) it, from
//! the same buffer, through page-locked staging straight into the bf16 weights it holds. Blocks
//! that arrived before both were known wait in a list that later reading tasks copy from the
//! file's buffer, which lives as long as the read. A read from a warm page cache copies nothing
//! (memory bandwidth is then what the read and the copies would share).
//!
//! When the backend is finished, [`EarlyUpload::finish`] stops the copies and waits for every
//! one queued; a weight counts as copied only when every byte of its range in the shard was, and
//! its range and device address are the ones the verified model's tensor has, so a header read
//! early can never put other bytes in a weight than the staged upload would. Everything else
//! (other element types, bytes that arrived too early or too late) goes the staged way of
//! `upload.rs`. Nothing on the device is used before the model's digest was checked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use cudarc::driver::result as drv;
use cudarc::driver::{CudaContext, CudaStream};
use safetensors::Dtype;
use safetensors::tensor::Metadata;

use crate::model::files::READ_BLOCK;
use crate::model::{BlockSink, CONFIG_FILE, DType};

use super::error::CudaInitError;
use super::upload::{Piece, PinnedBuffer};
use super::weights::WeightTargets;

/// Blocks are copied early only while the read runs below this rate (bytes per second, since
/// the read began): then the disk bounds the start-up and the copies hide behind it. Faster, the
/// page cache is warm and memory bandwidth is what the read and the copies would share: on the
/// H200 host a warm read of 16 GB (~10 GB/s) took 0.25 s longer with the copies than the staged
/// upload after it saved (`docs/cuda-backend.md`, "Weight upload"), so the weights are
/// left to that upload.
const COPY_BELOW_BYTES_PER_SEC: f64 = 4e9;

/// The read rate is judged only once this much time has passed since it began.
const RATE_AFTER: Duration = Duration::from_millis(100);

/// Blocks waiting for their shard's header or the targets that a reading task copies after
/// copying its own block.
const DRAIN_PER_BLOCK: usize = 2;

/// A tensor of a shard, as its header (read from the shard's first block) places it.
#[derive(Debug, Clone, PartialEq)]
struct HeaderTensor {
    name: String,
    /// Its bytes in the file.
    start: usize,
    end: usize,
    /// Stored as bf16 (the device's type: copied as they are).
    bf16: bool,
    shape: Vec<usize>,
}

/// A tensor of a shard with its place on the device.
#[derive(Debug)]
struct PlacedTensor {
    start: usize,
    end: usize,
    /// Device address its bytes are copied to as they are; 0 when they are not (another element
    /// type, another shape than expected, or not a weight of the architecture).
    dst: u64,
    /// Bytes copied so far (each byte of the file is handed over once).
    copied: AtomicUsize,
}

/// One file of the read.
#[derive(Debug)]
struct ReadFile {
    len: usize,
    shard: bool,
    config: bool,
    /// Address of the file's buffer (known from its first block handed over), 0 until then.
    host_base: AtomicUsize,
    /// The shard's tensors, from its first block; `None` when the header did not fit in it or
    /// does not describe this file.
    header: OnceLock<Option<Vec<HeaderTensor>>>,
    /// The header's tensors with their device addresses, once both are known.
    placed: OnceLock<Vec<PlacedTensor>>,
}

/// Where the tensors go: set once the weights' buffers were allocated.
struct Targets {
    context: Arc<CudaContext>,
    by_name: HashMap<String, (u64, Vec<usize>)>,
}

/// A block handed over before its place was known, still in its file's buffer.
struct Deferred {
    file: usize,
    offset: usize,
    /// Address of the block in the file's buffer.
    ptr: usize,
    len: usize,
}

/// A page-locked buffer of one block and the stream that copies from it to the weights.
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

/// The model's read, copying weight bytes to the device as they arrive; see the module docs.
#[derive(Default)]
pub struct EarlyUpload {
    /// Indexed as the files the read announced.
    files: OnceLock<Vec<ReadFile>>,
    targets: OnceLock<Targets>,
    deferred: Mutex<Vec<Deferred>>,
    /// Staging buffers not in use (as many are made as blocks are copied at once).
    staging: Mutex<Vec<Staging>>,
    /// Held (shared) by every copy from a block until its staging buffer is back in `staging`;
    /// `finish` takes it exclusively, so no copy is half queued when it waits for them.
    copying: RwLock<()>,
    /// Set by `finish` or on the first failure: nothing more is copied.
    stopped: AtomicBool,
    /// Every byte was handed over, or the read ended otherwise ([`EarlyUpload::read_over`]).
    over: AtomicBool,
    /// `config.json`'s bytes once handed over whole, or `None` once the read is over without it.
    config: Mutex<Option<Option<Vec<u8>>>>,
    config_seen: Condvar,
    /// When the read began (`begin`).
    began: OnceLock<Instant>,
    /// Bytes the read handed over so far, copied or not.
    seen: AtomicUsize,
    bytes: AtomicUsize,
    deferred_bytes: AtomicUsize,
    copy_nanos: AtomicU64,
    whole: AtomicUsize,
}

impl std::fmt::Debug for EarlyUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyUpload")
            .field("targets_known", &self.targets.get().is_some())
            .field("bytes", &self.bytes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What an early upload achieved, for the start-up log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EarlyStats {
    /// Weight bytes copied to the device while the model was read.
    pub bytes: usize,
    /// Of them, bytes of blocks that had waited for their place to be known.
    pub deferred_bytes: usize,
    /// Time the reading tasks spent copying, summed.
    pub copying: Duration,
    /// Weights whose every byte was copied (counted by [`EarlyUpload::finish`]).
    pub whole_tensors: usize,
}

/// The weights [`EarlyUpload::finish`] found copied whole, per shard.
#[derive(Debug, Default)]
pub(super) struct CopiedWeights {
    shards: Vec<CopiedShard>,
}

/// A shard's weights copied whole.
#[derive(Debug)]
struct CopiedShard {
    /// Address of the shard's buffer.
    base: usize,
    len: usize,
    /// Each copied tensor's range in the shard and device address, sorted.
    tensors: Vec<(usize, usize, u64)>,
}

impl CopiedWeights {
    /// Whether `piece` is already on the device: bf16 bytes of a shard's buffer whose exact
    /// range was copied whole to exactly `piece.dst`.
    pub(super) fn covers(&self, piece: &Piece<'_>) -> bool {
        if piece.dtype != DType::BF16 || piece.data.is_empty() {
            return false;
        }
        let at = piece.data.as_ptr() as usize;
        self.shards.iter().any(|shard| {
            let Some(start) = at
                .checked_sub(shard.base)
                .filter(|s| s + piece.data.len() <= shard.len)
            else {
                return false;
            };
            let copied = &shard.tensors;
            copied
                .binary_search_by_key(&start, |(s, _, _)| *s)
                .is_ok_and(|i| copied[i] == (start, start + piece.data.len(), piece.dst))
        })
    }
}

impl EarlyUpload {
    /// A sink that copies nothing until [`EarlyUpload::target`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The weights' buffers exist (in `context`, on a GPU that may be used: the platform's
    /// attestation passed) at `targets`: blocks handed over from now on, and those waiting, are
    /// copied into them. Later calls change nothing.
    pub(super) fn target(&self, context: Arc<CudaContext>, targets: &WeightTargets) {
        let by_name = targets
            .iter()
            .map(|t| (t.name.clone(), (t.dst, t.shape.clone())))
            .collect();
        let _ = self.targets.set(Targets { context, by_name });
    }

    /// `config.json`'s bytes, waiting until the read handed them over; `None` when it is over
    /// without them ([`EarlyUpload::read_over`], or every byte handed over).
    pub fn wait_for_config(&self) -> Option<Vec<u8>> {
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(bytes) = config.as_ref() {
                return bytes.clone();
            }
            config = self
                .config_seen
                .wait(config)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The read ended (whether it succeeded or not): nobody waits for `config.json` or for
    /// the read any more.
    pub fn read_over(&self) {
        self.over.store(true, Ordering::Release);
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        if config.is_none() {
            *config = Some(None);
        }
        self.config_seen.notify_all();
    }

    /// Waits while the read has not begun or runs from a warm page cache (faster than early
    /// copies pay, and using every core): returns once it is over ([`EarlyUpload::read_over`]),
    /// or judged bound by the disk, or the copies stopped. Work that competes with a warm read
    /// for the host's cores and memory (allocating the weights, timing the product paths,
    /// parsing the tokenizer) waits here and runs after it instead; from a cold page cache it
    /// runs beside the read, which the disk bounds.
    pub fn wait_while_read_is_fast(&self) {
        const POLL: Duration = Duration::from_millis(5);
        loop {
            if self.over.load(Ordering::Acquire) || self.stopped.load(Ordering::Acquire) {
                return;
            }
            let judged = self.began.get().is_some_and(|b| b.elapsed() > RATE_AFTER);
            if judged && !self.read_is_fast(self.seen.load(Ordering::Relaxed)) {
                return;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Whether the read handed over its list of files ([`BlockSink::begin`]).
    pub(super) fn read_began(&self) -> bool {
        self.began.get().is_some()
    }

    /// What was copied so far.
    pub fn stats(&self) -> EarlyStats {
        EarlyStats {
            bytes: self.bytes.load(Ordering::Relaxed),
            deferred_bytes: self.deferred_bytes.load(Ordering::Relaxed),
            copying: Duration::from_nanos(self.copy_nanos.load(Ordering::Relaxed)),
            whole_tensors: self.whole.load(Ordering::Relaxed),
        }
    }

    /// Stops the copies, waits for every one queued (in the current context) and returns the
    /// weights copied whole. Called before the weights are used or freed.
    pub(super) fn finish(&self) -> Result<CopiedWeights, CudaInitError> {
        self.stopped.store(true, Ordering::Release);
        let _no_copy_in_flight = self.copying.write().unwrap_or_else(|e| e.into_inner());
        let staging = std::mem::take(&mut *self.staging.lock().unwrap_or_else(|e| e.into_inner()));
        for buffer in &staging {
            buffer
                .stream
                .synchronize()
                .map_err(|e| CudaInitError::Weights(format!("copying while reading: {e}")))?;
        }
        drop(staging);
        self.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let mut copied = CopiedWeights::default();
        let mut whole_tensors = 0;
        for file in self.files.get().into_iter().flatten() {
            let (Some(placed), base) = (file.placed.get(), file.host_base.load(Ordering::Acquire))
            else {
                continue;
            };
            let whole: Vec<(usize, usize, u64)> = placed
                .iter()
                .filter(|t| t.dst != 0 && t.copied.load(Ordering::Acquire) == t.end - t.start)
                .map(|t| (t.start, t.end, t.dst))
                .collect();
            if base != 0 && !whole.is_empty() {
                whole_tensors += whole.len();
                copied.shards.push(CopiedShard {
                    base,
                    len: file.len,
                    tensors: whole,
                });
            }
        }
        self.whole.store(whole_tensors, Ordering::Relaxed);
        Ok(copied)
    }

    /// The tensors of `file` with their device addresses, once its header and the targets are
    /// both known.
    fn placed<'a>(&self, file: &'a ReadFile) -> Option<&'a [PlacedTensor]> {
        if let Some(placed) = file.placed.get() {
            return Some(placed);
        }
        let header = file.header.get()?.as_ref()?;
        let targets = self.targets.get()?;
        let placed = file.placed.get_or_init(|| {
            header
                .iter()
                .map(|t| {
                    let dst = match targets.by_name.get(&t.name) {
                        Some((dst, shape)) if t.bf16 && *shape == t.shape => *dst,
                        _ => 0,
                    };
                    PlacedTensor {
                        start: t.start,
                        end: t.end,
                        dst,
                        copied: AtomicUsize::new(0),
                    }
                })
                .collect()
        });
        Some(placed)
    }

    /// Whether the read, having handed over `seen` bytes, runs faster than early copies pay.
    fn read_is_fast(&self, seen: usize) -> bool {
        let Some(began) = self.began.get() else {
            return false;
        };
        let elapsed = began.elapsed();
        elapsed > RATE_AFTER && seen as f64 / elapsed.as_secs_f64() > COPY_BELOW_BYTES_PER_SEC
    }

    /// Copies the weight bytes of `bytes` (at `offset` of a shard whose tensors are `placed`)
    /// to the device through a staging buffer (a block at a time), so the reading task only
    /// copies into page-locked memory and goes on reading. Returns the bytes queued.
    fn copy(
        &self,
        context: &Arc<CudaContext>,
        placed: &[PlacedTensor],
        offset: usize,
        bytes: &[u8],
    ) -> Result<usize, String> {
        context
            .bind_to_thread()
            .map_err(|e| format!("binding the context: {e}"))?;
        let free = self.staging.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut staging = match free {
            Some(staging) => staging,
            None => Staging::new(context)?,
        };
        let mut queued = 0;
        let result = (|| {
            for (i, part) in bytes.chunks(READ_BLOCK).enumerate() {
                let (lo, hi) = (
                    offset + i * READ_BLOCK,
                    offset + i * READ_BLOCK + part.len(),
                );
                let first = placed.partition_point(|t| t.end <= lo);
                let tensors = placed[first..]
                    .iter()
                    .take_while(|t| t.start < hi)
                    .filter(|t| t.dst != 0);
                let mut staged: Option<&[u8]> = None;
                for tensor in tensors {
                    let (from, to) = (tensor.start.max(lo), tensor.end.min(hi));
                    if from >= to {
                        continue;
                    }
                    let staged = if let Some(staged) = staged {
                        staged
                    } else {
                        staging
                            .stream
                            .synchronize()
                            .map_err(|e| format!("waiting for a copy: {e}"))?;
                        let buffer = &mut staging.buffer.as_mut_slice()[..part.len()];
                        buffer.copy_from_slice(part);
                        let buffer: &[u8] = buffer;
                        staged = Some(buffer);
                        buffer
                    };
                    // SAFETY: `tensor.dst` is the start of the tensor's place in a weight's
                    // buffer, which holds its `end - start` bytes, so `dst + (from - start)`
                    // has room for `to - from`; the weights are freed only after `finish`
                    // waited for every staging stream. The staged bytes are not written again
                    // before this stream is synchronised (above, or when it is dropped).
                    unsafe {
                        drv::memcpy_htod_async(
                            tensor.dst + (from - tensor.start) as u64,
                            &staged[from - lo..to - lo],
                            staging.stream.cu_stream(),
                        )
                    }
                    .map_err(|e| format!("queueing a copy: {e}"))?;
                    tensor.copied.fetch_add(to - from, Ordering::AcqRel);
                    queued += to - from;
                }
            }
            Ok(())
        })();
        self.staging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(staging);
        result.map(|()| queued)
    }

    /// Copies `bytes` of `file` at `offset` when its place is known, returning the bytes
    /// queued (none once copies stopped); `None` when the place is not known yet.
    fn try_copy(&self, file: &ReadFile, offset: usize, bytes: &[u8]) -> Option<usize> {
        let (Some(targets), Some(placed)) = (self.targets.get(), self.placed(file)) else {
            return None;
        };
        let _copying = self.copying.read().unwrap_or_else(|e| e.into_inner());
        if self.stopped.load(Ordering::Acquire) {
            return Some(0);
        }
        let started = Instant::now();
        match self.copy(&targets.context, placed, offset, bytes) {
            Ok(queued) => {
                self.bytes.fetch_add(queued, Ordering::Relaxed);
                self.copy_nanos
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                Some(queued)
            }
            Err(why) => {
                self.stop(why);
                Some(0)
            }
        }
    }

    /// Copies up to [`DRAIN_PER_BLOCK`] waiting blocks whose place is known now. Called only
    /// from [`BlockSink::block`], while the read (which owns the files' buffers) runs.
    fn drain(&self, files: &[ReadFile]) {
        for _ in 0..DRAIN_PER_BLOCK {
            let ready = {
                let mut deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
                let at = deferred
                    .iter()
                    .position(|d| self.placed(&files[d.file]).is_some());
                at.map(|at| deferred.swap_remove(at))
            };
            let Some(block) = ready else {
                return;
            };
            // SAFETY: `ptr` and `len` are a block the read handed over earlier, in a file's
            // buffer that the read owns until every task of it returned (this one is one), that
            // is neither moved nor freed meanwhile, and whose bytes no task writes again (each
            // block is read once, before it is handed over).
            let bytes = unsafe { std::slice::from_raw_parts(block.ptr as *const u8, block.len) };
            let queued = self.try_copy(&files[block.file], block.offset, bytes);
            self.deferred_bytes
                .fetch_add(queued.unwrap_or(0), Ordering::Relaxed);
        }
    }

    fn stop(&self, why: String) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            tracing::warn!(%why, "early weight copies stopped; the rest goes the staged way");
        }
    }

    fn config_seen(&self, bytes: Option<Vec<u8>>) {
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        if config.is_none() {
            *config = Some(bytes);
        }
        self.config_seen.notify_all();
    }
}

/// The tensors a shard's header places, when the whole header is in `first` (the file's first
/// bytes) and describes a file of `len` bytes; sorted by where they start.
fn header_tensors(first: &[u8], len: usize) -> Option<Vec<HeaderTensor>> {
    let n = usize::try_from(u64::from_le_bytes(first.get(..8)?.try_into().ok()?)).ok()?;
    let data = n.checked_add(8)?;
    let metadata: Metadata = serde_json::from_slice(first.get(8..data)?).ok()?;
    if data.checked_add(metadata.data_len())? != len {
        return None;
    }
    let mut tensors: Vec<HeaderTensor> = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| HeaderTensor {
            name,
            start: data + info.data_offsets.0,
            end: data + info.data_offsets.1,
            bf16: info.dtype == Dtype::BF16,
            shape: info.shape.clone(),
        })
        .collect();
    tensors.sort_by_key(|t| (t.start, t.end));
    let disjoint = tensors.windows(2).all(|w| w[0].end <= w[1].start);
    (disjoint && tensors.iter().all(|t| t.start <= t.end && t.end <= len)).then_some(tensors)
}

impl BlockSink for EarlyUpload {
    fn begin(&self, files: &[(&str, usize)]) {
        let files = files
            .iter()
            .map(|(name, len)| ReadFile {
                len: *len,
                shard: name.ends_with(".safetensors"),
                config: *name == CONFIG_FILE,
                host_base: AtomicUsize::new(0),
                header: OnceLock::new(),
                placed: OnceLock::new(),
            })
            .collect::<Vec<_>>();
        if !files.iter().any(|f| f.config) {
            self.config_seen(None);
        }
        let _ = self.files.set(files);
        let _ = self.began.set(Instant::now());
    }

    fn block(&self, file: usize, offset: usize, bytes: &[u8]) {
        let seen = self.seen.fetch_add(bytes.len(), Ordering::Relaxed) + bytes.len();
        let Some(files) = self.files.get() else {
            return;
        };
        if seen >= files.iter().map(|f| f.len).sum::<usize>() {
            self.read_over();
        }
        let Some(target) = files.get(file) else {
            return;
        };
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > target.len)
        {
            return;
        }
        if target.config && offset == 0 && bytes.len() == target.len {
            self.config_seen(Some(bytes.to_vec()));
        }
        if !target.shard {
            return;
        }
        let _ = target.host_base.compare_exchange(
            0,
            bytes.as_ptr() as usize - offset,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if offset == 0 {
            let _ = target.header.set(header_tensors(bytes, target.len));
        }
        if self.stopped.load(Ordering::Acquire) || self.read_is_fast(seen) {
            return;
        }
        if self.try_copy(target, offset, bytes).is_none() {
            let mut deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
            // Checked again under the lock: a drain that ran since would have missed it.
            if self.placed(target).is_none() {
                deferred.push(Deferred {
                    file,
                    offset,
                    ptr: bytes.as_ptr() as usize,
                    len: bytes.len(),
                });
                return;
            }
            drop(deferred);
            self.try_copy(target, offset, bytes);
        }
        self.drain(files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of a bf16 `[2, 3]` tensor `a` and an f32 `[2]` tensor `b`.
    fn shard() -> Vec<u8> {
        use safetensors::tensor::TensorView;
        let a = vec![1u8; 12];
        let b = vec![2u8; 8];
        let tensors = [
            ("a", TensorView::new(Dtype::BF16, vec![2, 3], &a).unwrap()),
            ("b", TensorView::new(Dtype::F32, vec![2], &b).unwrap()),
        ];
        safetensors::serialize(tensors, None).unwrap()
    }

    #[test]
    fn a_header_in_the_first_block_places_every_tensor() {
        let bytes = shard();
        let tensors = header_tensors(&bytes, bytes.len()).expect("a whole header");
        let data = bytes.len() - 20;
        assert_eq!(tensors.len(), 2);
        let a = tensors.iter().find(|t| t.name == "a").unwrap();
        let b = tensors.iter().find(|t| t.name == "b").unwrap();
        assert_eq!((a.bf16, a.shape.as_slice()), (true, &[2, 3][..]));
        assert!(!b.bf16);
        assert_eq!(&bytes[a.start..a.end], &[1u8; 12]);
        assert_eq!(&bytes[b.start..b.end], &[2u8; 8]);
        assert!(tensors.iter().all(|t| t.start >= data));
        // A header cut by the block, or one describing a file of another length, places nothing.
        assert_eq!(header_tensors(&bytes[..20], bytes.len()), None);
        assert_eq!(header_tensors(&bytes, bytes.len() + 1), None);
        assert_eq!(header_tensors(&bytes[..4], bytes.len()), None);
    }

    #[test]
    fn before_the_targets_are_known_blocks_wait_and_nothing_is_copied() {
        let early = EarlyUpload::new();
        let bytes = shard();
        early.begin(&[("config.json", 2), ("model.safetensors", bytes.len())]);
        early.block(1, 0, &bytes);
        assert_eq!(early.stats(), EarlyStats::default());
        assert_eq!(early.deferred.lock().unwrap().len(), 1);
        let copied = early.finish().unwrap();
        assert!(
            early.deferred.lock().unwrap().is_empty(),
            "finish forgets them"
        );
        let piece = Piece {
            dst: 0x1000,
            dtype: DType::BF16,
            data: &bytes[8..20],
        };
        assert!(!copied.covers(&piece));
    }

    #[test]
    fn copied_weights_cover_only_their_exact_range_and_address() {
        let buffer = [0u8; 64];
        let base = buffer.as_ptr() as usize;
        let copied = CopiedWeights {
            shards: vec![CopiedShard {
                base,
                len: 64,
                tensors: vec![(8, 20, 0x1000), (20, 32, 0x2000)],
            }],
        };
        let piece = |range: std::ops::Range<usize>, dst: u64, dtype: DType| Piece {
            dst,
            dtype,
            data: &buffer[range],
        };
        assert!(copied.covers(&piece(8..20, 0x1000, DType::BF16)));
        assert!(copied.covers(&piece(20..32, 0x2000, DType::BF16)));
        assert!(
            !copied.covers(&piece(8..20, 0x2000, DType::BF16)),
            "another address"
        );
        assert!(
            !copied.covers(&piece(8..18, 0x1000, DType::BF16)),
            "part of it"
        );
        assert!(
            !copied.covers(&piece(8..32, 0x1000, DType::BF16)),
            "more than it"
        );
        assert!(
            !copied.covers(&piece(8..20, 0x1000, DType::F16)),
            "not bf16"
        );
        let other = [0u8; 64];
        let elsewhere = Piece {
            dst: 0x1000,
            dtype: DType::BF16,
            data: &other[8..20],
        };
        assert!(!copied.covers(&elsewhere), "another buffer");
    }

    #[test]
    fn the_wait_for_a_warm_read_ends_when_it_is_over_or_disk_bound() {
        let early = Arc::new(EarlyUpload::new());
        early.begin(&[("model.safetensors", 1 << 40)]);
        let waiter = {
            let early = early.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                early.wait_while_read_is_fast();
                started.elapsed()
            })
        };
        // Nothing handed over: judged bound by the disk once the rate is judged.
        let waited = waiter.join().unwrap();
        assert!(waited >= RATE_AFTER / 2, "{waited:?}");

        let early = EarlyUpload::new();
        early.begin(&[("model.safetensors", 1 << 40)]);
        early.read_over();
        early.wait_while_read_is_fast();

        let early = EarlyUpload::new();
        early.begin(&[("model.safetensors", 1 << 40)]);
        early.finish().unwrap();
        early.wait_while_read_is_fast();

        assert!(!EarlyUpload::new().read_began());
    }

    #[test]
    fn the_configuration_is_waited_for_until_the_read_is_over() {
        let early = Arc::new(EarlyUpload::new());
        early.begin(&[("config.json", 2), ("model.safetensors", 4)]);
        let waiter = {
            let early = early.clone();
            std::thread::spawn(move || early.wait_for_config())
        };
        early.block(0, 0, b"{}");
        assert_eq!(waiter.join().unwrap(), Some(b"{}".to_vec()));

        let early = Arc::new(EarlyUpload::new());
        early.begin(&[("config.json", 2)]);
        let waiter = {
            let early = early.clone();
            std::thread::spawn(move || early.wait_for_config())
        };
        early.read_over();
        assert_eq!(
            waiter.join().unwrap(),
            None,
            "a failed read wakes the waiter"
        );

        let early = EarlyUpload::new();
        early.begin(&[("model.safetensors", 4)]);
        assert_eq!(early.wait_for_config(), None, "no config.json in the read");
    }
}
