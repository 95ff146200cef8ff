//! Step queueing: packing a batch's inputs, choosing how it runs (decode graph, segment graphs
//! or eagerly), sampling, and the engine's [`Backend`] interface.

use std::time::Instant;

use cudarc::driver::result as drv;

use crate::engine::{
    Backend, BackendError, BatchRow, KvCacheShape, PositionOutput, SampleSpec, SampledToken,
    StepOutput, TokenLogprob,
};

use crate::backend::cuda::inputs::{
    Padding, StepLayout, fill_late_masks, pack_positions, pack_step_with_late_masks,
};
use crate::backend::cuda::kernels::{self, SAMPLE_STRIDE};
use crate::backend::cuda::launch::{LaunchShape, SampleTokens};
use crate::backend::cuda::memory::DeviceBuffer;
use crate::backend::cuda::plan;

use super::{CudaBackend, dev, to_u32};

/// How a step's forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepPath {
    /// Replaying the decode graph of this many rows.
    Decode(usize),
    /// Replaying the segment graphs of this many tokens, attention launched between them.
    Mixed(usize),
    /// Every launch from the host.
    Eager,
}

/// A step whose inputs are copied and forward pass queued, but not yet sampled.
pub(super) struct QueuedStep {
    pub(super) layout: StepLayout,
    /// The decode graph's bucket, when the step replayed one (the step waiter keys on it).
    pub(super) bucket: Option<usize>,
    /// When the forward pass was queued (for the step waiter).
    pub(super) queued: Instant,
    /// Which sampled rows get their grammar masks after the forward pass was queued.
    late: Vec<bool>,
}

/// What a queued step samples, beyond what its rows carry.
#[derive(Clone, Copy)]
pub(super) struct Extra<'s, 'a> {
    /// `Some`: the sampled positions of each row (`pack_positions`) instead of each row's last
    /// token.
    pub(super) positions: Option<&'s [&'s [SampleSpec<'a>]]>,
    /// Words appended to the packed inputs and copied with them (index lists for launches
    /// queued after the forward pass); they start at the layout's `len()`.
    pub(super) words: &'s [i32],
}

impl Extra<'_, '_> {
    /// Nothing beyond the rows.
    pub(super) const NONE: Extra<'static, 'static> = Extra {
        positions: None,
        words: &[],
    };
}

impl CudaBackend {
    /// How a step runs, and the padding that takes: replaying its decode bucket's graph when
    /// every row decodes one token and needs the next, and a graph was captured for that many
    /// rows; else eagerly when it samples several positions of a row (`positional`, speculative
    /// verification) and has at most `plan::GEMV_MAX_M` tokens (its products then take the
    /// small-M kernels; `CudaOptions::eager_small_steps`); else replaying the segments of its
    /// token-count bucket, when one was captured that pads it little; else eagerly.
    fn step_path(&self, rows: &[BatchRow<'_>], positional: bool) -> (StepPath, Padding) {
        let decode_only = !positional
            && rows
                .iter()
                .all(|r| r.tokens.len() == 1 && r.sample.is_some());
        if decode_only && let Some(bucket) = plan::bucket_for(self.graphs.buckets(), rows.len()) {
            return (
                StepPath::Decode(bucket),
                Padding::DecodeRows(bucket - rows.len()),
            );
        }
        let tokens = rows.iter().map(|r| r.tokens.len()).sum();
        if positional && self.options.eager_small_steps && tokens <= plan::GEMV_MAX_M {
            return (StepPath::Eager, Padding::None);
        }
        match plan::mixed_bucket_for(self.mixed.buckets(), tokens) {
            Some(bucket) => (StepPath::Mixed(bucket), Padding::Tokens(bucket - tokens)),
            None => (StepPath::Eager, Padding::None),
        }
    }

    /// Copies the words `words` of the packed inputs to the same place in the device input
    /// buffer (the caller counts the copy when it belongs to a step).
    pub(super) fn copy_inputs(
        &mut self,
        words: std::ops::Range<usize>,
    ) -> Result<usize, BackendError> {
        let bytes = words.len() * 4;
        let source = self.host_inputs.get(words.clone()).ok_or_else(|| {
            BackendError::InvalidBatch(format!("copy of input words {words:?} out of range"))
        })?;
        // SAFETY: the device buffer holds `max_words` words and `pack_step` refused any step
        // longer than that, so `words` (within the packed step) lies inside it; the host vector
        // stays alive, and these words unmodified, until the stream is synchronised at the end
        // of the step (late masks are written to words after those of the first copy).
        unsafe {
            drv::memcpy_htod_async(
                self.act.inputs.ptr() + (words.start * 4) as u64,
                source,
                self.stream.cu_stream(),
            )
        }
        .map_err(dev("copying step inputs"))?;
        Ok(bytes)
    }

    /// Copies the late mask slots `words` of the packed inputs to the device on the second
    /// stream, beside the forward pass; the step's stream waits for the copy before it samples.
    fn copy_late_masks(&mut self, words: std::ops::Range<usize>) -> Result<usize, BackendError> {
        let bytes = words.len() * 4;
        let source = self.host_inputs.get(words.clone()).ok_or_else(|| {
            BackendError::InvalidBatch(format!("copy of late mask words {words:?} out of range"))
        })?;
        // SAFETY: the slots lie within the packed step, which `pack_step` kept within the
        // device buffer's `max_words` words; the forward pass reads only what precedes the
        // block tables, the step's first copy (which may have zeroed the slots) is done before
        // this one starts (the second stream waits for it), and the sampler is queued after
        // the step's stream waits for this copy; the host vector stays alive and unmodified
        // until the step's stream is synchronised at the end of the step.
        unsafe {
            self.late_copy.copy(
                &self.stream,
                self.act.inputs.ptr() + (words.start * 4) as u64,
                source,
            )
        }
        .map_err(dev("copying late grammar masks"))?;
        Ok(bytes)
    }

    /// Packs a step (with slots for its late masks), copies everything but those slots to the
    /// device and queues the forward pass; None for a step without tokens.
    pub(super) fn queue_step(
        &mut self,
        rows: &[BatchRow<'_>],
        late: &[bool],
        extra: Extra<'_, '_>,
    ) -> Result<Option<QueuedStep>, BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(dev("binding the context"))?;
        let (path, padding) = self.step_path(rows, extra.positions.is_some());
        let mut host = std::mem::take(&mut self.host_inputs);
        let layout = match extra.positions {
            Some(specs) => pack_positions(rows, specs, padding, &self.limits, &mut host),
            None => pack_step_with_late_masks(rows, late, padding, &self.limits, &mut host),
        };
        let fits = layout
            .as_ref()
            .is_ok_and(|l| l.len() + extra.words.len() <= self.limits.max_words);
        host.extend_from_slice(extra.words);
        self.host_inputs = host;
        let layout = layout?;
        if !fits {
            return Err(BackendError::InvalidBatch(format!(
                "step inputs and {} index words overflow the input buffer",
                extra.words.len()
            )));
        }
        self.copies.steps += 1;
        if layout.is_empty() {
            return Ok(None);
        }
        let queued = Instant::now();
        // Late masks are copied when they are known; extra words come with the rest.
        let first_copy = if extra.words.is_empty() {
            layout.late_mask_slots()
        } else {
            layout.len() + extra.words.len()
        };
        let bytes = self.copy_inputs(0..first_copy)?;
        self.copies.record_h2d(bytes);
        if layout.late_masks > 0 {
            self.late_copy
                .inputs_queued(&self.stream)
                .map_err(dev("marking the step's input copy"))?;
        }
        // A decode graph's split bound was fixed at capture; the other paths take the step's.
        let splits = self.split_bound(layout.num_tokens, layout.max_context);
        let bucket = match path {
            StepPath::Decode(bucket) => {
                self.graphs
                    .get(bucket)?
                    .replay()
                    .map_err(dev("replaying the decode graph"))?;
                self.graphs.count_replay();
                Some(bucket)
            }
            StepPath::Mixed(bucket) => {
                self.forward_mixed(&layout, bucket, splits)?;
                None
            }
            StepPath::Eager => {
                self.forward(&layout, splits)?;
                None
            }
        };
        Ok(Some(QueuedStep {
            layout,
            bucket,
            queued,
            late: late.to_vec(),
        }))
    }

    /// Copies a queued step's late masks (a second, small copy, only when it has any), samples
    /// its rows and returns the tokens (or the logits, without device sampling).
    pub(super) fn finish_queued(
        &mut self,
        step: QueuedStep,
        rows: &[BatchRow<'_>],
        positions: Option<&[&[SampleSpec<'_>]]>,
    ) -> Result<StepOutput, BackendError> {
        let QueuedStep {
            layout,
            bucket,
            queued,
            late,
        } = step;
        if layout.late_masks > 0 {
            let slots = fill_late_masks(rows, &late, &layout, &mut self.host_inputs)?;
            let bytes = self.copy_late_masks(slots)?;
            self.copies.record_h2d(bytes);
        }
        // Grammar masks and logit biases travel in the packed inputs: every row samples here.
        let device_sampling = self.options.sample_on_device;
        let s = layout.real_samples();
        if s == 0 {
            self.settle(bucket, queued)?;
            return Ok(if device_sampling {
                StepOutput::Sampled(Vec::new())
            } else {
                StepOutput::Logits(Vec::new())
            });
        }
        let vocab = self.params.vocab;
        if !device_sampling {
            self.settle(bucket, queued)?;
            let flat: Vec<f32> = self.download(self.act.logits.ptr(), s * vocab)?;
            return Ok(StepOutput::Logits(
                flat.chunks_exact(vocab).map(<[f32]>::to_vec).collect(),
            ));
        }
        self.launch(
            &self.kernels.sample,
            LaunchShape::new((to_u32(s, "samples")?, 1, 1), 1024),
            SampleTokens {
                logits: self.act.logits.device_ptr(),
                scratch: self.act.probs.device_ptr(),
                top_n: self.input(layout.top_n()),
                params: self.input(layout.sample_params()),
                lists: self.input(layout.lists()),
                out: self.act.sampled.device_ptr(),
            },
        )?;
        self.settle(bucket, queued)?;
        let words: Vec<i32> = self.download(self.act.sampled.ptr(), s * SAMPLE_STRIDE)?;
        let tops: Vec<Option<u32>> = match positions {
            Some(specs) => specs
                .iter()
                .flat_map(|row| row.iter().map(|s| s.logprobs))
                .collect(),
            None => rows
                .iter()
                .filter_map(|r| r.sample.as_ref().map(|s| s.logprobs))
                .collect(),
        };
        let tokens = words
            .chunks_exact(SAMPLE_STRIDE)
            .zip(tops)
            .map(|(w, top)| SampledToken {
                token: w[0] as u32,
                logprob: top.map(|k| TokenLogprob {
                    logprob: f32::from_bits(w[1] as u32),
                    top: (0..(k as usize).min(kernels::MAX_TOP_LOGPROBS))
                        .map(|i| (w[2 + 2 * i] as u32, f32::from_bits(w[3 + 2 * i] as u32)))
                        .collect(),
                }),
            })
            .collect();
        Ok(StepOutput::Sampled(tokens))
    }

    /// Waits for the step without spinning through it (see `wait.rs`): a replayed decode step
    /// by sleeping through its expected duration, any other on a blocking event.
    pub(super) fn settle(
        &mut self,
        bucket: Option<usize>,
        queued: Instant,
    ) -> Result<(), BackendError> {
        match bucket {
            Some(bucket) => self.waiter.wait(&self.stream, bucket, queued),
            None => self.waiter.wait_blocking(&self.stream),
        }
        .map_err(dev("waiting for the step"))
    }

    pub(super) fn download<T: Copy + Default>(
        &mut self,
        src: u64,
        len: usize,
    ) -> Result<Vec<T>, BackendError> {
        let mut out = vec![T::default(); len];
        // SAFETY: `src` addresses a device buffer of at least `len` elements of T (logits or the
        // sampling output, sized for max_rows rows); the host vector outlives the copy because
        // the stream is synchronised before returning.
        unsafe { drv::memcpy_dtoh_async(&mut out[..], src, self.stream.cu_stream()) }
            .map_err(dev("copying results"))?;
        self.copies.record_d2h(len * std::mem::size_of::<T>());
        self.stream.synchronize().map_err(dev("step"))?;
        Ok(out)
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }

    fn kv_cache(&self) -> KvCacheShape {
        self.kv_shape
    }

    fn max_rows(&self) -> Option<usize> {
        Some(self.limits.max_rows)
    }

    fn step_sizes(&self) -> &[usize] {
        self.mixed.buckets()
    }

    fn step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        if self.started.is_some() {
            return Err(BackendError::InvalidBatch(
                "a started step was not finished".into(),
            ));
        }
        match self.queue_step(rows, &[], Extra::NONE)? {
            Some(step) => self.finish_queued(step, rows, None),
            None => Ok(StepOutput::Logits(Vec::new())),
        }
    }

    /// Queues the step, then the final norm of the hidden rows' last tokens (into `act.normed`,
    /// after the LM head read it: the stream runs in order), and downloads those rows (bf16,
    /// the precision the LM head reads) before sampling.
    fn step_with_hidden(
        &mut self,
        rows: &[BatchRow<'_>],
        hidden: &[usize],
    ) -> Result<(StepOutput, Vec<Vec<f32>>), BackendError> {
        if hidden.is_empty() {
            return Ok((self.step(rows)?, Vec::new()));
        }
        if self.started.is_some() {
            return Err(BackendError::InvalidBatch(
                "a started step was not finished".into(),
            ));
        }
        let mut last_tokens = Vec::with_capacity(hidden.len());
        for &row in hidden {
            let end: usize = rows
                .get(..=row)
                .ok_or_else(|| {
                    BackendError::InvalidBatch(format!(
                        "hidden state asked of row {row} of a step of {} rows",
                        rows.len()
                    ))
                })?
                .iter()
                .map(|r| r.tokens.len())
                .sum();
            last_tokens.push(to_u32(end.saturating_sub(1), "token index")? as i32);
        }
        let step = self
            .queue_step(rows, &[], Extra::NONE)?
            .ok_or_else(|| BackendError::InvalidBatch("a step without tokens".into()))?;
        let bytes: Vec<u8> = last_tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        // Kept alive until `download` below synchronises the stream.
        let index = DeviceBuffer::from_bytes(&bytes)?;
        self.add_rmsnorm(
            to_u32(hidden.len(), "hidden rows")?,
            Some(self.act.delta.device_ptr()),
            self.weights.final_norm.device_ptr(),
            Some(index.device_ptr()),
        )?;
        let width = self.params.hidden;
        let normed: Vec<u16> = self.download(self.act.normed.ptr(), hidden.len() * width)?;
        drop(index);
        let states = normed
            .chunks_exact(width)
            .map(|row| {
                row.iter()
                    .map(|&bits| f32::from_bits(u32::from(bits) << 16))
                    .collect()
            })
            .collect();
        Ok((self.finish_queued(step, rows, None)?, states))
    }

    /// Queues the step when the device samples (it applies the masks, late ones included);
    /// with host sampling the engine needs the logits, and the step runs whole.
    fn start_step(&mut self, rows: &[BatchRow<'_>], late: &[bool]) -> Result<bool, BackendError> {
        if !self.options.sample_on_device || rows.is_empty() {
            return Ok(false);
        }
        if self.started.is_some() {
            return Err(BackendError::InvalidBatch(
                "a started step was not finished".into(),
            ));
        }
        self.started = self.queue_step(rows, late, Extra::NONE)?;
        Ok(self.started.is_some())
    }

    fn finish_step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        let step = self.started.take().ok_or_else(|| {
            BackendError::InvalidBatch("finish_step without a started step".into())
        })?;
        self.finish_queued(step, rows, None)
    }

    fn position_logits(&self) -> bool {
        true
    }

    fn step_logits(
        &mut self,
        rows: &[BatchRow<'_>],
        positions: &[usize],
        hidden: &[usize],
    ) -> Result<PositionOutput, BackendError> {
        self.position_logits_step(rows, positions, hidden)
    }

    fn sampled_positions(&self) -> bool {
        self.options.sample_on_device
    }

    fn step_sampled_positions(
        &mut self,
        rows: &[BatchRow<'_>],
        specs: &[&[SampleSpec<'_>]],
    ) -> Result<Vec<SampledToken>, BackendError> {
        self.sampled_positions_step(rows, specs)
    }
}
