//! The CUDA implementation of [`Backend`]: weights, KV cache and activations on the GPU, decode
//! steps replayed from CUDA graphs (other steps run eagerly), sampling (every mode of the
//! engine's reference sampler) and logprobs on the device.
//!
//! The backend is split by job: `device` opens the GPU and prepares ahead of the model, `setup`
//! builds the backend beside the weight upload, `products` chooses and runs the matrix products,
//! `capture` records the CUDA graphs, `forward` runs the model definition's layers, `step`
//! queues steps and samples, and `positions` serves steps that need several positions of a row
//! (speculative verification, prompt logprobs).

mod algorithms;
mod capture;
mod device;
mod forward;
mod gpt_oss;
mod late_masks;
mod moe;
mod moe_fp8;
mod positions;
mod products;
mod setup;
mod step;

pub use device::OpenedDevice;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};

use crate::backend::BackendPhases;
use crate::engine::kv_groups::LayerPlace;
use crate::engine::{BackendError, KvCacheShape};
use crate::model::ModelDefinition;

use super::choices::ChoiceStore;
use super::gemm::Gemm;
use super::graphs::{DecodeGraphs, MixedStepGraphs};
use super::inputs::{CopyStats, StepLimits};
use super::kernels::KernelParams;
use super::launch::{
    AddRmsnorm, AttentionReduce, DevicePtr, EmbeddingGather, Fp8AddRmsnorm, Fp8DequantizeWeight,
    Fp8Gemv, Fp8QuantizeInput, Fp8ScaleOutput, Gemv, GemvQkvRope, GemvSwiglu, Kernel, KernelArgs,
    Kv, LaunchShape, PagedAttention, PrefillAttention, QkvRopeWrite, SampleTokens, Swiglu,
};
use super::memory::DeviceBuffer;
use super::wait::StepWaiter;
use super::weights::ModelWeightsOnDevice;
use late_masks::LateMaskCopy;
use step::QueuedStep;

/// Options of the CUDA backend beyond the engine configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// The GPU to use.
    pub device: usize,
    /// Sample every row on the GPU and return only ids and logprobs. When false (tests that
    /// compare logits), every step returns raw logits.
    pub sample_on_device: bool,
    /// Run prefill attention in the tiled prefill kernel (`kernels/prefill_attention.cu`). When
    /// false, the paged split-K kernel serves prefill too (tests compare the two).
    pub flash_prefill: bool,
    /// Time the small-M kernel against cuBLASLt for every decode product shape at start-up and
    /// keep the faster per shape, and cuBLASLt's candidate algorithms at the step row counts
    /// above 8 (`plan::tuned_rows`), keeping the fastest. When false, every shape the small-M
    /// kernel fits uses it and cuBLASLt its heuristic's first algorithm, so two backends on the
    /// same model compute bit for bit the same (tests that compare them).
    pub measure_products: bool,
    /// Blocks (tiles × KV heads) of full-geometry prefill tiles a step without decode rows must
    /// make before the warpgroup prefill kernel takes them (Hopper); a step with fewer, or with
    /// decode rows, cuts every row into small tiles for the `mma.sync` variant, which runs
    /// several blocks to an SM where the warpgroup kernel runs one, in one launch. `None`: two
    /// waves (twice the device's SM count); tests set `Some(0)` to take the warpgroup kernel
    /// whenever it can.
    pub warpgroup_prefill_blocks: Option<usize>,
    /// Run a step that samples several positions of a row (speculative verification, device
    /// sampling) and has at most `plan::GEMV_MAX_M` tokens (batch 1 with up to 7 proposals)
    /// eagerly, its products in the small-M kernels, instead of padding it to the smallest
    /// mixed-step graph bucket, whose products cuBLASLt runs. False: such steps take the
    /// bucket (tests compare the two).
    pub eager_small_steps: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            device: 0,
            sample_on_device: true,
            flash_prefill: true,
            measure_products: true,
            warpgroup_prefill_blocks: None,
            eager_small_steps: true,
        }
    }
}

/// The attention entry points of one window (`kernels/attention.cu`, `prefill_attention.cu`).
struct AttentionKernels {
    /// Paged attention (decode, and prefill where the tiled kernel cannot take the group).
    paged: Kernel<PagedAttention>,
    /// The merge of split partial results.
    reduce: Kernel<AttentionReduce>,
    /// Tiled prefill attention.
    prefill: Kernel<PrefillAttention>,
    /// Its small-tile variant.
    prefill_small: Kernel<PrefillAttention>,
}

/// The entry points the forward pass launches.
struct Kernels {
    embedding: Kernel<EmbeddingGather>,
    add_rmsnorm: Kernel<AddRmsnorm>,
    qkv_rope: Kernel<QkvRopeWrite>,
    /// The attention kernels (with the sliding window, where the model has one).
    attention: AttentionKernels,
    /// The same without the window, for the full layers of a model whose layers alternate
    /// sliding and full attention (gpt-oss).
    attention_full: Option<AttentionKernels>,
    swiglu: Kernel<Swiglu>,
    sample: Kernel<SampleTokens>,
    /// `gemv[m - 1]` computes products of m rows (`kernels/gemv.cu`).
    gemv: Vec<Kernel<Gemv>>,
    /// `gemv_swiglu[m - 1]`: the gate/up product of m rows with SwiGLU applied.
    gemv_swiglu: Vec<Kernel<GemvSwiglu>>,
    /// `gemv_qkv_rope[m - 1]`: the q/k/v product of m rows with the rope write applied.
    gemv_qkv_rope: Vec<Kernel<GemvQkvRope>>,
    /// A product's input quantized to FP8 (`kernels/fp8.cu`).
    fp8_quantize: Kernel<Fp8QuantizeInput>,
    /// An FP8 projection widened to bf16.
    fp8_dequantize: Kernel<Fp8DequantizeWeight>,
    /// The scales applied to cuBLASLt's FP8 product of the codes.
    fp8_scale_output: Kernel<Fp8ScaleOutput>,
    /// The residual add and RMSNorm with the output quantized for an FP8 product.
    fp8_add_rmsnorm: Kernel<Fp8AddRmsnorm>,
    /// SwiGLU with its output quantized to FP8 for the down product.
    fp8_swiglu_quantize: Kernel<super::launch::Fp8SwigluQuantize>,
    /// `fp8_gemv[GemvGeometry::entry(m)]`: FP8 products of m rows.
    fp8_gemv: Vec<Kernel<Fp8Gemv>>,
    /// The rope write of an FP8 q/k/v product left unscaled, its scales applied first.
    qkv_rope_scaled: Kernel<super::launch::QkvRopeWriteScaled>,
    /// `fp8_gemv_swiglu[m - 1]`: the FP8 gate/up product of m rows with SwiGLU applied.
    fp8_gemv_swiglu: Vec<Kernel<super::launch::Fp8GemvSwiglu>>,
    /// `fp8_gemv_qkv_rope[m - 1]`: the FP8 q/k/v product of m rows with the rope write applied.
    fp8_gemv_qkv_rope: Vec<Kernel<super::launch::Fp8GemvQkvRope>>,
    /// The mixture-of-experts kernels, for a model with experts.
    moe: Option<moe::MoeKernels>,
    /// gpt-oss's expert kernels, for a model with gpt-oss's experts.
    gpt_oss: Option<gpt_oss::GptOssKernels>,
}

/// Scratch buffers of one step, sized for the step limits.
struct Activations {
    inputs: DeviceBuffer,
    residual: DeviceBuffer,
    normed: DeviceBuffer,
    qkv: DeviceBuffer,
    q: DeviceBuffer,
    attn: DeviceBuffer,
    delta: DeviceBuffer,
    gate_up: DeviceBuffer,
    mlp: DeviceBuffer,
    part_acc: DeviceBuffer,
    part_ml: DeviceBuffer,
    /// Per token and KV head, the decode attention blocks that have finished (zero between
    /// launches; see `kernels/attention.cu`).
    merge_counts: DeviceBuffer,
    logits: DeviceBuffer,
    sampled: DeviceBuffer,
    probs: DeviceBuffer,
    /// The FP8 products' buffers, for a model with FP8 projections.
    fp8: Option<Fp8Scratch>,
    /// The mixture of experts' buffers, for a model with experts.
    moe: Option<super::moe::MoeScratch>,
}

/// The FP8 products' buffers (`products.rs`).
struct Fp8Scratch {
    /// A product's input quantized: E4M3 codes, [tokens, width].
    codes: DeviceBuffer,
    /// The same codes times their scales in bf16, [tokens, width].
    values: DeviceBuffer,
    /// Their scales, [tokens, groups].
    scales: DeviceBuffer,
    /// The largest FP8 projection widened to bf16 (the products cuBLASLt's FP8 path does not
    /// take).
    weights: DeviceBuffer,
}

/// The CUDA backend.
///
/// Fields drop in declaration order: device buffers and the cuBLASLt handle first, then the
/// kernels, the stream and last the context they all live in.
pub struct CudaBackend {
    /// What the model's layers compute: the forward pass launches what it declares.
    definition: ModelDefinition,
    graphs: DecodeGraphs,
    mixed: MixedStepGraphs,
    waiter: StepWaiter,
    weights: ModelWeightsOnDevice,
    kv: KvCache,
    act: Activations,
    gemm: Gemm,
    kernels: Kernels,
    /// Copies late grammar masks on a second stream while the forward pass runs.
    late_copy: LateMaskCopy,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    params: KernelParams,
    kv_shape: KvCacheShape,
    limits: StepLimits,
    split_budget: usize,
    /// Decode attention blocks the device runs at once (SMs × the kernel's blocks per SM): the
    /// wave `plan::split_bound` sizes its splits for.
    attention_blocks: usize,
    /// The device's SMs (the FP8 small-M launches size their splits of K by them).
    sm_count: usize,
    graph_split_context: usize,
    host_inputs: Vec<i32>,
    options: CudaOptions,
    copies: CopyStats,
    /// The step queued by `start_step`, waiting for `finish_step` (and its late grammar masks).
    started: Option<QueuedStep>,
    /// Launch kernels with programmatic dependent launch (the configuration allows it and the
    /// device has compute capability 9.0 or later).
    programmatic: bool,
    /// Whether cuBLASLt's FP8 product serves the FP8 products of more than 8 rows (cleared the
    /// first time it fails; they are then widened to bf16).
    fp8_gemm: bool,
    /// How long each start-up phase took.
    phases: BackendPhases,
    /// Where the small-M product choices for this GPU, its libraries and kernels are stored
    /// (none without a kernel cache directory).
    choices: Option<ChoiceStore>,
}

/// The paged KV cache in one allocation: every slot's keys, then every slot's values, each
/// slot's `[blocks, block size, kv heads, head dim]` of bf16 or, with an FP8 cache, E4M3 bytes
/// (`kernels/prelude.cuh`: `kv_t`); and each layer's k and v scales, `[layers, 2]` f32 (1.0 until
/// [`KvCache::write_scales`] stores the checkpoint's; only an FP8 cache's kernels read them).
///
/// A slot is one layer's storage. With one KV group (`engine::kv_groups`) every layer has its own
/// slot, as before groups existed; with a full-attention and a sliding group, slot `i` holds the
/// `i`-th layer of whichever group a block belongs to (the groups' layers share the blocks'
/// storage), so there are as many slots as the larger group has layers.
struct KvCache {
    buffer: DeviceBuffer,
    scales: DeviceBuffer,
    /// Each layer's group and slot.
    places: Vec<LayerPlace>,
    slots: usize,
    layer_bytes: usize,
}

impl KvCache {
    /// A cache of `slots` slots of `layer_bytes` bytes each for layers at `places`.
    fn new(
        places: Vec<LayerPlace>,
        slots: usize,
        layer_bytes: usize,
    ) -> Result<Self, BackendError> {
        let ones: Vec<u8> = std::iter::repeat_n(1.0f32.to_ne_bytes(), 2 * places.len())
            .flatten()
            .collect();
        Ok(Self {
            buffer: DeviceBuffer::new(2 * slots * layer_bytes)?,
            scales: DeviceBuffer::from_bytes(&ones)?,
            places,
            slots,
            layer_bytes,
        })
    }

    /// The KV group of `layer`: which block tables, slots and rows of a step it reads.
    fn group(&self, layer: usize) -> usize {
        self.places[layer].group
    }

    /// The keys of `layer`.
    fn keys(&self, layer: usize) -> DevicePtr<Kv> {
        self.buffer
            .device_ptr_at(self.places[layer].slot * self.layer_bytes)
    }

    /// The values of `layer`.
    fn values(&self, layer: usize) -> DevicePtr<Kv> {
        self.buffer
            .device_ptr_at((self.slots + self.places[layer].slot) * self.layer_bytes)
    }

    /// The k and v scales of `layer`.
    fn scales(&self, layer: usize) -> DevicePtr<f32> {
        self.scales.device_ptr_at(layer * 2 * 4)
    }

    /// Stores every layer's `[k_scale, v_scale]` (synchronously: at load, before any step).
    fn write_scales(&self, scales: &[[f32; 2]]) -> Result<(), BackendError> {
        if scales.len() != self.places.len() {
            return Err(BackendError::Device(format!(
                "{} KV-cache scale pairs for {} layers",
                scales.len(),
                self.places.len()
            )));
        }
        let bytes: Vec<u8> = scales
            .iter()
            .flatten()
            .flat_map(|s| s.to_ne_bytes())
            .collect();
        self.scales.write_at(0, &bytes)
    }
}

/// What [`CudaBackend::device_parts`] builds while the weights are copied.
struct DeviceParts {
    kernels: Kernels,
    /// Kernel compilation (or the cache).
    compile: Duration,
    /// Compilation and module loading.
    kernels_ready: Duration,
    gemm: Gemm,
    act: Activations,
    kv: KvCache,
    kv_shape: KvCacheShape,
    limits: StepLimits,
    split_budget: usize,
    attention_blocks: usize,
    sm_count: usize,
    graph_split_context: usize,
    max_words: usize,
    waiter: StepWaiter,
    late_copy: LateMaskCopy,
    choices: Option<ChoiceStore>,
}

fn dev<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> BackendError {
    move |e| BackendError::Device(format!("{what}: {e}"))
}

fn to_u32(value: usize, what: &str) -> Result<u32, BackendError> {
    u32::try_from(value).map_err(|_| {
        BackendError::InvalidBatch(format!("{what} {value} overflows a launch dimension"))
    })
}

impl CudaBackend {
    /// How long each start-up phase took (kernel compilation overlapped the upload).
    pub fn startup_phases(&self) -> BackendPhases {
        self.phases
    }

    /// Decode steps replayed from a CUDA graph so far.
    pub fn graph_replays(&self) -> u64 {
        self.graphs.replays()
    }

    /// The batch-size buckets with a captured decode graph (empty when graphs are off).
    pub fn graph_buckets(&self) -> &[usize] {
        self.graphs.buckets()
    }

    /// Steps with prompt tokens whose segments were replayed from graphs so far.
    pub fn mixed_graph_replays(&self) -> u64 {
        self.mixed.replays()
    }

    /// The token-count buckets with captured mixed-step segment graphs (empty when off).
    pub fn mixed_graph_buckets(&self) -> &[usize] {
        self.mixed.buckets()
    }

    /// Copies made by steps so far.
    pub fn copy_stats(&self) -> CopyStats {
        self.copies
    }

    /// Distinct GEMM shapes planned so far (each with its cached algorithm).
    pub fn planned_gemm_shapes(&self) -> usize {
        self.gemm.planned_shapes()
    }

    /// Starts (`true`) or stops (`false`) profiler data collection for this backend's context,
    /// after the launches queued so far have finished: a profiler started with collection off
    /// (`ncu --profile-from-start off`) then sees only the steps in between.
    pub fn profiler_collect(&self, on: bool) -> Result<(), BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(dev("binding the context"))?;
        self.stream
            .synchronize()
            .map_err(dev("finishing before the profiler range"))?;
        // SAFETY: both calls take no arguments and act on the context current on this thread,
        // bound above; nothing is in flight on the backend's stream.
        let result = unsafe {
            if on {
                cudarc::driver::sys::cuProfilerStart()
            } else {
                cudarc::driver::sys::cuProfilerStop()
            }
        };
        result
            .result()
            .map_err(dev("starting or stopping the profiler"))
    }

    /// Queues `kernel` on the backend's stream in `shape` with `args`, with programmatic
    /// dependent launch where the backend uses it ([`Kernel::launch`]).
    fn launch<A: KernelArgs>(
        &self,
        kernel: &Kernel<A>,
        shape: LaunchShape,
        args: A,
    ) -> Result<(), BackendError> {
        kernel.launch(&self.stream, self.programmatic, shape, &args)
    }

    /// Word `offset` of the step's packed inputs on the device.
    fn input(&self, offset: usize) -> DevicePtr<i32> {
        self.act.inputs.device_ptr_at(offset * 4)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Buffers are freed by their own Drop; they need this context current on this thread.
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
    }
}
