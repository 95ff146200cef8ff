//! The CUDA implementation of [`Backend`]: weights, KV cache and activations on the GPU, decode
//! steps replayed from CUDA graphs (other steps run eagerly), sampling (every mode of the
//! engine's reference sampler) and logprobs on the device.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result as drv;
use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaFunction, CudaGraph, CudaStream, DriverError};
use indicatif::ProgressBar;

use crate::backend::BackendPhases;
use crate::engine::{
    Backend, BackendError, BatchRow, EngineConfig, KvCacheShape, SampledToken, StepOutput,
    TokenLogprob,
};
use crate::model::{Model, ModelConfig, ModelTensors};

use super::cc;
use super::choices::{ChoiceStore, ChosenShape};
use super::compile::{self, KernelError};
use super::early::{CopiedWeights, EarlyStats, EarlyUpload};
use super::gemm::Gemm;
use super::graphs::{DecodeGraphs, MixedStepGraphs, StepGraph};
use super::inputs::{
    self, CopyStats, Padding, StepLayout, StepLimits, fill_late_masks, pack_step,
    pack_step_with_late_masks,
};
use super::kernels::{self, KernelParams, SAMPLE_STRIDE};
use super::launch::{
    AddRmsnorm, AttentionReduce, Bf16, DevicePtr, EmbeddingGather, Gemv, GemvQkvRope, GemvSwiglu,
    Kernel, KernelArgs, LaunchShape, PagedAttention, PagedReads, PrefillAttention, QkvRopeWrite,
    RopeWrites, SampleTokens, Swiglu,
};
use super::memory::DeviceBuffer;
use super::plan;
use super::probe::{self, CudaUnavailable};
use super::upload::UploadStats;
use super::wait::StepWaiter;
use super::weights::{LayerWeights, ModelWeightsOnDevice, WeightTargets};

/// Why the CUDA backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum CudaInitError {
    /// No usable driver or GPU.
    #[error(transparent)]
    Unavailable(#[from] CudaUnavailable),
    /// The model's shapes are outside what the kernels serve.
    #[error("the CUDA backend cannot serve this model: {0}")]
    Unsupported(String),
    /// A kernel failed to compile or load.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A weight is missing or malformed.
    #[error("weights: {0}")]
    Weights(String),
    /// The device failed.
    #[error("CUDA device: {0}")]
    Device(String),
}

impl From<BackendError> for CudaInitError {
    fn from(e: BackendError) -> Self {
        CudaInitError::Device(e.to_string())
    }
}

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
    /// keep the faster per shape. When false, every shape the small-M kernel fits uses it, so
    /// two backends on the same model compute bit for bit the same (tests that compare them).
    pub measure_products: bool,
    /// Blocks (tiles × KV heads) of full-geometry prefill tiles a step without decode rows must
    /// make before the warpgroup prefill kernel takes them (Hopper); a step with fewer, or with
    /// decode rows, cuts every row into small tiles for the `mma.sync` variant, which runs
    /// several blocks to an SM where the warpgroup kernel runs one, in one launch. `None`: two
    /// waves (twice the device's SM count); tests set `Some(0)` to take the warpgroup kernel
    /// whenever it can.
    pub warpgroup_prefill_blocks: Option<usize>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            device: 0,
            sample_on_device: true,
            flash_prefill: true,
            measure_products: true,
            warpgroup_prefill_blocks: None,
        }
    }
}

/// A CUDA device opened ahead of the model: the driver probed, the context and the backend's
/// stream created. Opening needs nothing from the model, so it can run on another thread while
/// the model is read or parsed, but only once the GPU may be used (after the start-up
/// attestation set its confidential-computing ready state).
pub struct OpenedDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    major: i32,
    arch: String,
    name: String,
    took: Duration,
    early: Option<Arc<EarlyUpload>>,
    preparing: Option<Box<PreparingBackend>>,
}

/// A backend being built from a model's configuration before its weights were read, on a
/// thread of its own: every buffer, the KV cache, the product paths and the decode graphs; the
/// weights' buffers exist from the start, their contents undefined.
struct PreparingBackend {
    /// Where each tensor goes in the weights.
    targets: WeightTargets,
    /// What it is built for: used only for a model, engine and options equal to these.
    model: ModelConfig,
    engine: EngineConfig,
    options: CudaOptions,
    build: std::thread::JoinHandle<Prepared>,
}

/// How the preparation ended.
enum Prepared {
    Ready(Box<CudaBackend>),
    /// The error, and what was built (the weights among it), to be freed only once nothing
    /// copies into the weights any more.
    Failed(CudaInitError, Box<dyn Send>),
}

/// The kernels compiled (or taken from the cache) and loaded for one set of parameters.
struct LoadedKernels {
    kernels: Kernels,
    /// Every family's cache key, in `kernels::FAMILIES` order.
    cache_keys: Vec<String>,
    /// Compilation (or the cache).
    compile: Duration,
    /// Compilation and module loading.
    ready: Duration,
}

impl LoadedKernels {
    /// Compiles and loads every entry point for `params` in `ctx` (bound to this thread), with
    /// the shared-memory opt-ins the larger ones need.
    fn load(
        ctx: &Arc<CudaContext>,
        params: &KernelParams,
        arch: &str,
    ) -> Result<Self, CudaInitError> {
        let started = Instant::now();
        let compiled = compile::compile_all(params, arch)?;
        let compile = started.elapsed();
        let cache_keys = compiled.iter().map(|c| c.key.clone()).collect();
        let kernels = Kernels::take(compile::load_all(ctx, compiled)?)?;
        if params.flash.shared_bytes > 0 {
            // Above the default 48 KiB a block must opt in to its dynamic shared memory.
            kernels
                .prefill_attention
                .allow_dynamic_shared(params.flash.shared_bytes)
                .map_err(|e| {
                    CudaInitError::Device(format!("prefill attention shared memory: {e}"))
                })?;
        }
        // The tensor-core small-M entries' rings are above the default 48 KiB too.
        for m in 1..=plan::GEMV_MAX_M {
            let shared = params.gemv_geometry(m).shared_bytes;
            if shared == 0 {
                continue;
            }
            let opted_in = |result: Result<(), DriverError>| {
                result.map_err(|e| {
                    CudaInitError::Device(format!("small-M product shared memory: {e}"))
                })
            };
            opted_in(kernels.gemv[m - 1].allow_dynamic_shared(shared))?;
            opted_in(kernels.gemv_swiglu[m - 1].allow_dynamic_shared(shared))?;
            opted_in(kernels.gemv_qkv_rope[m - 1].allow_dynamic_shared(shared))?;
        }
        Ok(Self {
            kernels,
            cache_keys,
            compile,
            ready: started.elapsed(),
        })
    }
}

/// The kernel parameters of `cfg` on the device of `ctx` (architecture `arch`).
fn kernel_params(
    ctx: &Arc<CudaContext>,
    cfg: &ModelConfig,
    arch: &str,
) -> Result<KernelParams, CudaInitError> {
    let shared_per_block = usize::try_from(
        ctx.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
        .map_err(|e| CudaInitError::Device(format!("shared memory per block: {e}")))?,
    )
    .unwrap_or(0);
    Ok(KernelParams::from_config(cfg).for_device(arch, shared_per_block))
}

impl OpenedDevice {
    /// Probes the driver (a one-line error without one or without a GPU) and opens GPU
    /// `ordinal`.
    pub fn open(ordinal: usize) -> Result<Self, CudaInitError> {
        let started = Instant::now();
        probe::probe()?;
        let driver = started.elapsed();
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaInitError::Device(e.to_string()))?;
        let context = started.elapsed() - driver;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| CudaInitError::Device(e.to_string()))?;
        let arch = kernels::arch_for(major, minor);
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        match cc::read_cc_state() {
            Some(state) => tracing::info!(
                environment = state.environment,
                cc_enabled = state.feature_enabled,
                devtools = state.devtools,
                "confidential-computing state (read only)"
            ),
            None => {
                tracing::info!("confidential-computing state unavailable (NVML missing or too old)")
            }
        }
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaInitError::Device(e.to_string()))?;
        let took = started.elapsed();
        tracing::info!(
            driver_ms = driver.as_millis() as u64,
            context_ms = context.as_millis() as u64,
            total_ms = took.as_millis() as u64,
            "GPU opened (driver loaded and initialised, then the context)"
        );
        Ok(Self {
            ctx,
            stream,
            major,
            arch,
            name,
            took,
            early: None,
            preparing: None,
        })
    }

    /// Lets `early`, the sink of the model's read, copy the weight bytes it is handed to this
    /// GPU once [`OpenedDevice::prepare_backend`] allocated the weights; the backend built on
    /// this device uploads only what it did not copy whole.
    pub fn copy_early(&mut self, early: Arc<EarlyUpload>) {
        self.early = Some(early);
    }

    /// Starts building everything of the backend for a model with configuration `model` but the
    /// weights' contents, ahead of the model (from a `config.json` read apart from the hashed
    /// files, while they are read): the weights' buffers are allocated here (from then on the
    /// early copies land in them), then a thread of its own compiles and loads the kernels,
    /// allocates the step buffers and the KV cache, chooses the product paths and captures the
    /// decode graphs. With an early upload ([`OpenedDevice::copy_early`]) whose read began, all
    /// of it waits first while that read runs from a warm page cache, and so does this call:
    /// such a read copies nothing early and needs the host's cores and memory system, so the
    /// work runs beside the upload after it instead. The backend built on this device uses it
    /// only for exactly this configuration, engine configuration and options, and builds its
    /// own otherwise.
    pub fn prepare_backend(
        &mut self,
        model: &ModelConfig,
        engine: &EngineConfig,
        options: CudaOptions,
    ) -> Result<(), CudaInitError> {
        let started = Instant::now();
        let params = kernel_params(&self.ctx, model, &self.arch)?;
        if let Some(why) = params.unsupported() {
            return Err(CudaInitError::Unsupported(why));
        }
        // A read that has not begun is not waited for: the weights are ready when it does.
        if let Some(early) = self.early.as_ref().filter(|early| early.read_began()) {
            early.wait_while_read_is_fast();
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaInitError::Device(e.to_string()))?;
        let (weights, targets) = ModelWeightsOnDevice::allocate_for(model)?;
        let (ctx, stream) = (self.ctx.clone(), self.stream.clone());
        let (arch, name, major, took) =
            (self.arch.clone(), self.name.clone(), self.major, self.took);
        let (model_config, engine_config) = (model.clone(), engine.clone());
        let build = std::thread::Builder::new()
            .name("inferno-prepare".into())
            .spawn(move || {
                if let Err(e) = ctx.bind_to_thread() {
                    return Prepared::Failed(
                        CudaInitError::Device(e.to_string()),
                        Box::new(weights),
                    );
                }
                let parts = match CudaBackend::device_parts(
                    &ctx,
                    &stream,
                    &model_config,
                    &engine_config,
                    &options,
                    &params,
                    &arch,
                    major,
                    &name,
                ) {
                    Ok(parts) => parts,
                    Err(err) => return Prepared::Failed(err, Box::new(weights)),
                };
                let mut backend = CudaBackend::from_parts(
                    ctx,
                    stream,
                    weights,
                    parts,
                    params,
                    &engine_config,
                    options,
                    major,
                    took,
                );
                let graphs = (engine_config.cuda_graphs, engine_config.cuda_mixed_graphs);
                match backend.choose_and_capture(graphs.0, graphs.1) {
                    Ok(()) => {
                        tracing::info!(
                            ready_ms = started.elapsed().as_millis() as u64,
                            kv_blocks = backend.kv_shape.num_blocks,
                            choose_ms = backend.phases.gemm_selection.as_millis() as u64,
                            capture_ms = backend.phases.graphs.as_millis() as u64,
                            "backend prepared from the configuration while the model is read"
                        );
                        Prepared::Ready(Box::new(backend))
                    }
                    Err(err) => Prepared::Failed(err.into(), Box::new(backend)),
                }
            })
            .map_err(|e| CudaInitError::Device(format!("starting the preparation thread: {e}")))?;
        // Only now: had the thread not started, the weights would already be freed.
        if let Some(early) = &self.early {
            early.target(self.ctx.clone(), &targets);
        }
        self.preparing = Some(Box::new(PreparingBackend {
            targets,
            model: model.clone(),
            engine: engine.clone(),
            options,
            build,
        }));
        Ok(())
    }
}

impl std::fmt::Debug for OpenedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedDevice")
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish_non_exhaustive()
    }
}

/// The entry points the forward pass launches.
struct Kernels {
    embedding: Kernel<EmbeddingGather>,
    add_rmsnorm: Kernel<AddRmsnorm>,
    qkv_rope: Kernel<QkvRopeWrite>,
    attention: Kernel<PagedAttention>,
    attention_reduce: Kernel<AttentionReduce>,
    prefill_attention: Kernel<PrefillAttention>,
    prefill_attention_small: Kernel<PrefillAttention>,
    swiglu: Kernel<Swiglu>,
    sample: Kernel<SampleTokens>,
    /// `gemv[m - 1]` computes products of m rows (`kernels/gemv.cu`).
    gemv: Vec<Kernel<Gemv>>,
    /// `gemv_swiglu[m - 1]`: the gate/up product of m rows with SwiGLU applied.
    gemv_swiglu: Vec<Kernel<GemvSwiglu>>,
    /// `gemv_qkv_rope[m - 1]`: the q/k/v product of m rows with the rope write applied.
    gemv_qkv_rope: Vec<Kernel<GemvQkvRope>>,
}

impl Kernels {
    fn take(mut map: HashMap<&'static str, CudaFunction>) -> Result<Self, KernelError> {
        let map = &mut map;
        Ok(Self {
            embedding: Kernel::take(map, "embedding_gather")?,
            add_rmsnorm: Kernel::take(map, "add_rmsnorm")?,
            qkv_rope: Kernel::take(map, "qkv_rope_write")?,
            attention: Kernel::take(map, "paged_attention")?,
            attention_reduce: Kernel::take(map, "attention_reduce")?,
            prefill_attention: Kernel::take(map, "prefill_attention")?,
            prefill_attention_small: Kernel::take(map, "prefill_attention_small")?,
            swiglu: Kernel::take(map, "swiglu")?,
            sample: Kernel::take(map, "sample_tokens")?,
            gemv: take_each(map, &kernels::GEMV_ENTRIES)?,
            gemv_swiglu: take_each(map, &kernels::GEMV_SWIGLU_ENTRIES)?,
            gemv_qkv_rope: take_each(map, &kernels::GEMV_QKV_ROPE_ENTRIES)?,
        })
    }
}

/// The entry points `entries`, in order, out of the loaded `map`.
fn take_each<A: KernelArgs>(
    map: &mut HashMap<&'static str, CudaFunction>,
    entries: &[&'static str],
) -> Result<Vec<Kernel<A>>, KernelError> {
    entries
        .iter()
        .map(|entry| Kernel::take(map, entry))
        .collect()
}

/// What `CudaBackend::choose_small_m_products` times with a product: the product alone, or with
/// the work a step runs after it (which the small-M path folds into its epilogue).
#[derive(Debug, Clone, Copy)]
enum TimedProduct {
    /// The product alone, into `out`.
    Plain { out: DevicePtr<f32> },
    /// The gate/up product and SwiGLU.
    GateUpSwiglu,
    /// The q/k/v product and the rope write.
    QkvRopeWrite,
}

impl TimedProduct {
    /// Its name in the stored choices.
    fn name(self) -> &'static str {
        match self {
            Self::Plain { .. } => "plain",
            Self::GateUpSwiglu => "gate_up_swiglu",
            Self::QkvRopeWrite => "qkv_rope_write",
        }
    }
}

/// Where the small-M product choices are stored in the kernel cache `dir`, keyed by everything
/// they depend on: the GPU (`name`), its driver, cuBLASLt, the kernels (`kernel_keys`, the
/// families' cache keys: source with the model's shapes, architecture and NVRTC's version) and
/// whether kernels launch with programmatic dependent launch.
fn product_choice_store(
    dir: &std::path::Path,
    name: &str,
    kernel_keys: &[String],
    programmatic: bool,
) -> Result<ChoiceStore, CudaInitError> {
    let mut driver = 0;
    // SAFETY: `driver` is a valid place for the one integer the call writes.
    let status = unsafe { sys::cuDriverGetVersion(&mut driver) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaInitError::Device(format!(
            "reading the driver's version: {status:?}"
        )));
    }
    let mut parts = vec![
        name.to_string(),
        format!("driver {driver}"),
        format!("cublasLt {}", Gemm::library_version()),
        format!("programmatic launch {programmatic}"),
    ];
    parts.extend(kernel_keys.iter().cloned());
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    Ok(ChoiceStore::new(dir, &parts))
}

/// A product shape `CudaBackend::choose_small_m_products` times: `x[m, k] · w[n, k]ᵀ` for m up
/// to `max_m`, on each of `weights` (one per layer) in turn.
struct TimedShape {
    what: TimedProduct,
    x: DevicePtr<Bf16>,
    weights: Vec<DevicePtr<Bf16>>,
    n: usize,
    k: usize,
    max_m: usize,
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
}

/// The CUDA backend.
///
/// Fields drop in declaration order: device buffers and the cuBLASLt handle first, then the
/// kernels, the stream and last the context they all live in.
pub struct CudaBackend {
    graphs: DecodeGraphs,
    mixed: MixedStepGraphs,
    waiter: StepWaiter,
    weights: ModelWeightsOnDevice,
    kv: KvCache,
    act: Activations,
    gemm: Gemm,
    kernels: Kernels,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    params: KernelParams,
    kv_shape: KvCacheShape,
    limits: StepLimits,
    split_budget: usize,
    /// Decode attention blocks the device runs at once (SMs × the kernel's blocks per SM): the
    /// wave `plan::split_bound` sizes its splits for.
    attention_blocks: usize,
    graph_split_context: usize,
    host_inputs: Vec<i32>,
    options: CudaOptions,
    copies: CopyStats,
    /// The step queued by `start_step`, waiting for `finish_step` (and its late grammar masks).
    started: Option<QueuedStep>,
    /// Launch kernels with programmatic dependent launch (the configuration allows it and the
    /// device has compute capability 9.0 or later).
    programmatic: bool,
    /// How long each start-up phase took.
    phases: BackendPhases,
    /// Where the small-M product choices for this GPU, its libraries and kernels are stored
    /// (none without a kernel cache directory).
    choices: Option<ChoiceStore>,
}

/// The paged KV cache in one allocation: every layer's keys, then every layer's values, each
/// layer's `[blocks, block size, kv heads, head dim]` bf16.
struct KvCache {
    buffer: DeviceBuffer,
    layers: usize,
    layer_bytes: usize,
}

impl KvCache {
    fn new(layers: usize, layer_bytes: usize) -> Result<Self, BackendError> {
        Ok(Self {
            buffer: DeviceBuffer::new(2 * layers * layer_bytes)?,
            layers,
            layer_bytes,
        })
    }

    /// The keys of `layer`.
    fn keys(&self, layer: usize) -> DevicePtr<Bf16> {
        self.buffer.device_ptr_at(layer * self.layer_bytes)
    }

    /// The values of `layer`.
    fn values(&self, layer: usize) -> DevicePtr<Bf16> {
        self.buffer
            .device_ptr_at((self.layers + layer) * self.layer_bytes)
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
    graph_split_context: usize,
    max_words: usize,
    waiter: StepWaiter,
    choices: Option<ChoiceStore>,
}

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
struct QueuedStep {
    layout: StepLayout,
    /// The decode graph's bucket, when the step replayed one (the step waiter keys on it).
    bucket: Option<usize>,
    /// When the forward pass was queued (for the step waiter).
    queued: Instant,
    /// Which sampled rows get their grammar masks after the forward pass was queued.
    late: Vec<bool>,
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
    /// Uploads the model, compiles the kernels (in parallel with the upload), sizes the KV cache
    /// from the free memory and logs the startup timeline.
    pub fn new(
        model: &Model,
        config: &EngineConfig,
        options: CudaOptions,
    ) -> Result<Self, CudaInitError> {
        Self::new_reporting(model.tensors(), config, options, &ProgressBar::hidden())
    }

    /// [`CudaBackend::new`] from a model's configuration and weights, advancing `progress` by
    /// the weight bytes uploaded.
    pub fn new_reporting(
        model: ModelTensors<'_>,
        config: &EngineConfig,
        options: CudaOptions,
        progress: &ProgressBar,
    ) -> Result<Self, CudaInitError> {
        let params = KernelParams::from_config(model.config);
        if let Some(why) = params.unsupported() {
            return Err(CudaInitError::Unsupported(why));
        }
        let device = OpenedDevice::open(options.device)?;
        Self::on_device(device, model, config, options, progress)
    }

    /// [`CudaBackend::new_reporting`] on a device opened beforehand (for instance on another
    /// thread while the model was read or parsed); `options.device` is not used.
    pub fn on_device(
        device: OpenedDevice,
        model: ModelTensors<'_>,
        config: &EngineConfig,
        options: CudaOptions,
        progress: &ProgressBar,
    ) -> Result<Self, CudaInitError> {
        let started = Instant::now();
        let cfg = model.config;
        let OpenedDevice {
            ctx,
            stream,
            major,
            arch,
            name,
            took: t_context,
            early,
            preparing,
        } = device;
        ctx.bind_to_thread()
            .map_err(|e| CudaInitError::Device(e.to_string()))?;
        // The copies made while the model was read stop here: every one queued has landed
        // before the weights are used, or freed.
        let copied = match &early {
            Some(early) => early.finish()?,
            None => CopiedWeights::default(),
        };
        if let Some(preparing) = preparing {
            if preparing.model == *cfg
                && preparing.engine == *config
                && preparing.options == options
            {
                let stats = early.map(|e| e.stats()).unwrap_or_default();
                return Self::finish_prepared(
                    *preparing, &ctx, model, &copied, stats, progress, started,
                );
            }
            tracing::warn!("the backend prepared ahead was for another configuration; building it");
            // Freed once built: nothing copies into its weights any more.
            drop(preparing.build.join());
        }
        let params = kernel_params(&ctx, cfg, &arch)?;
        if let Some(why) = params.unsupported() {
            return Err(CudaInitError::Unsupported(why));
        }
        // Every weight's buffer is allocated first (the KV cache is sized from what is left).
        // The copies into them run on other threads while this one compiles and loads the
        // kernels, allocates the KV cache, chooses the product paths and captures the decode
        // graphs, none of which depends on what the weights hold. The copies are joined before
        // the backend is returned, and before the buffers are freed on an error, so no step
        // ever sees a weight half copied.
        let (weights, pieces) = ModelWeightsOnDevice::allocate(model)?;
        let upload_ctx = ctx.clone();
        let upload_started = Instant::now();
        std::thread::scope(|scope| {
            let uploader = scope.spawn(move || {
                ModelWeightsOnDevice::upload(&upload_ctx, &pieces, progress)
                    .map(|_| upload_started.elapsed())
            });
            let finish_upload = |uploader: std::thread::ScopedJoinHandle<'_, _>| {
                uploader.join().unwrap_or_else(|_| {
                    Err(CudaInitError::Weights("the upload thread panicked".into()))
                })
            };
            let parts = match Self::device_parts(
                &ctx, &stream, cfg, config, &options, &params, &arch, major, &name,
            ) {
                Ok(parts) => parts,
                Err(err) => {
                    // The copies still target `weights`: they finish before it is freed.
                    let _ = finish_upload(uploader);
                    return Err(err);
                }
            };
            let parts_compile = parts.compile;
            let mut backend = Self::from_parts(
                ctx, stream, weights, parts, params, config, options, major, t_context,
            );
            let prepared = backend.choose_and_capture(config.cuda_graphs, config.cuda_mixed_graphs);
            let uploaded = finish_upload(uploader);
            prepared?;
            backend.phases.weights = uploaded?;
            tracing::info!(
                context_ms = t_context.as_millis() as u64,
                upload_ms = backend.phases.weights.as_millis() as u64,
                compile_ms = parts_compile.as_millis() as u64,
                choose_ms = backend.phases.gemm_selection.as_millis() as u64,
                capture_ms = backend.phases.graphs.as_millis() as u64,
                ready_ms = started.elapsed().as_millis() as u64,
                weight_bytes = backend.weights.bytes(),
                "CUDA backend ready (kernels, KV cache, product paths and graphs overlapped the upload)"
            );
            Ok(backend)
        })
    }

    /// The backend prepared ahead (`preparing`, in `ctx`), with the weights the early copies did
    /// not place whole uploaded from `model` (which has the configuration it was prepared for)
    /// while its preparation finishes.
    fn finish_prepared(
        preparing: PreparingBackend,
        ctx: &Arc<CudaContext>,
        model: ModelTensors<'_>,
        copied: &CopiedWeights,
        early: EarlyStats,
        progress: &ProgressBar,
        started: Instant,
    ) -> Result<Self, CudaInitError> {
        let PreparingBackend { targets, build, .. } = preparing;
        // On an error here the preparation thread keeps its weights until it ends; nothing
        // copies into them any more.
        let pieces = targets.pieces(model.weights)?;
        let tensors = pieces.len();
        let rest: Vec<_> = pieces.into_iter().filter(|p| !copied.covers(p)).collect();
        let (prepared, uploaded) = std::thread::scope(|scope| {
            let uploader = scope.spawn(|| {
                if rest.is_empty() {
                    Ok(UploadStats::default())
                } else {
                    ModelWeightsOnDevice::upload(ctx, &rest, progress)
                }
            });
            let prepared = build.join();
            let uploaded = uploader.join().unwrap_or_else(|_| {
                Err(CudaInitError::Weights("the upload thread panicked".into()))
            });
            (prepared, uploaded)
        });
        // Nothing copies into the weights any more: what the preparation kept may be freed.
        let mut backend = match prepared {
            Ok(Prepared::Ready(backend)) => *backend,
            Ok(Prepared::Failed(err, _built)) => return Err(err),
            Err(_) => {
                return Err(CudaInitError::Device(
                    "the preparation thread panicked".into(),
                ));
            }
        };
        let uploaded = uploaded?;
        backend.phases.weights = uploaded.wall;
        tracing::info!(
            copied_while_read = early.bytes,
            of_it_waiting = early.deferred_bytes,
            copy_ms_summed = early.copying.as_millis() as u64,
            tensors,
            tensors_copied_whole = tensors - rest.len(),
            uploaded_bytes = uploaded.bytes,
            upload_ms = uploaded.wall.as_millis() as u64,
            ready_ms = started.elapsed().as_millis() as u64,
            "CUDA backend ready (prepared while the model was read; what was not copied then uploaded beside its end)"
        );
        Ok(backend)
    }

    /// The backend from its weights and the parts built on the device; the product paths not
    /// yet chosen, no graph captured.
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        weights: ModelWeightsOnDevice,
        parts: DeviceParts,
        params: KernelParams,
        config: &EngineConfig,
        options: CudaOptions,
        major: i32,
        t_context: Duration,
    ) -> Self {
        Self {
            graphs: DecodeGraphs::default(),
            mixed: MixedStepGraphs::default(),
            waiter: parts.waiter,
            ctx,
            stream,
            kernels: parts.kernels,
            params,
            weights,
            kv: parts.kv,
            kv_shape: parts.kv_shape,
            act: parts.act,
            gemm: parts.gemm,
            limits: parts.limits,
            split_budget: parts.split_budget,
            attention_blocks: parts.attention_blocks,
            graph_split_context: parts.graph_split_context,
            host_inputs: Vec::with_capacity(parts.max_words),
            options,
            copies: CopyStats::default(),
            started: None,
            programmatic: config.programmatic_launch && major >= 9,
            phases: BackendPhases {
                context: t_context,
                kernels: parts.kernels_ready,
                ..BackendPhases::default()
            },
            choices: parts.choices,
        }
    }

    /// Everything of the backend but the weights, built on the device while the weights are
    /// copied: the kernels (compiled, or from the cache, and loaded), the product planner, the
    /// step buffers, the KV cache in what memory is left, the step limits and the step waiter.
    #[allow(clippy::too_many_arguments)]
    fn device_parts(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        cfg: &ModelConfig,
        config: &EngineConfig,
        options: &CudaOptions,
        params: &KernelParams,
        arch: &str,
        major: i32,
        name: &str,
    ) -> Result<DeviceParts, CudaInitError> {
        let LoadedKernels {
            kernels,
            cache_keys,
            compile: t_compile,
            ready: t_kernels,
        } = LoadedKernels::load(ctx, params, arch)?;

        // Step buffers are sized for the configured sequence limit, or for the cap when it is
        // derived; the derived limit (below, from the KV blocks) never exceeds that.
        let buffer_rows = config
            .max_num_seqs
            .unwrap_or(crate::engine::MAX_NUM_SEQS_CAP)
            .max(1);
        let max_tokens = config.max_batched_tokens.max(buffer_rows).max(1);
        let max_rows = buffer_rows;
        let split_budget = plan::split_budget(max_tokens);
        let gemm_started = Instant::now();
        let gemm = Gemm::new()?;
        let t_gemm = gemm_started.elapsed();
        let max_context_model = cfg.max_position_embeddings.max(1);
        let max_blocks_per_seq = max_context_model.div_ceil(crate::engine::BLOCK_SIZE);
        let max_penalty_tokens = cfg.vocab_size.min(max_context_model);
        let max_words = inputs::max_words(
            max_tokens,
            max_rows,
            max_blocks_per_seq,
            max_penalty_tokens,
            cfg.vocab_size,
        );
        let act_started = Instant::now();
        let act = Activations::new(cfg, max_tokens, max_rows, split_budget, max_words)?;
        let t_act = act_started.elapsed();

        let (free, total) = ctx
            .mem_get_info()
            .map_err(|e| CudaInitError::Device(e.to_string()))?;
        let block_bytes =
            plan::kv_block_bytes(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim);
        let num_blocks = plan::kv_blocks(free, config.gpu_memory_fraction, block_bytes);
        if num_blocks == 0 {
            return Err(CudaInitError::Device(format!(
                "no room for the KV cache: {free} bytes free, gpu_memory_fraction {}",
                config.gpu_memory_fraction
            )));
        }
        let max_rows = config
            .max_num_seqs
            .unwrap_or_else(|| crate::engine::derive_max_num_seqs(num_blocks, Some(buffer_rows)))
            .max(1);
        let layer_bytes =
            num_blocks * crate::engine::BLOCK_SIZE * cfg.num_key_value_heads * cfg.head_dim * 2;
        let kv_started = Instant::now();
        let kv = KvCache::new(cfg.num_hidden_layers, layer_bytes)?;
        let kv_alloc = kv_started.elapsed();
        let kv_shape = KvCacheShape {
            num_blocks,
            block_size: crate::engine::BLOCK_SIZE,
        };
        tracing::info!(
            gpu = %name,
            arch = %arch,
            blocks = num_blocks,
            capacity_tokens = kv_shape.capacity_tokens(),
            kv_bytes = num_blocks * block_bytes,
            load_ms = (t_kernels - t_compile).as_millis() as u64,
            planner_ms = t_gemm.as_millis() as u64,
            buffers_ms = t_act.as_millis() as u64,
            alloc_ms = kv_alloc.as_millis() as u64,
            free_bytes = free,
            total_bytes = total,
            "KV cache allocated"
        );
        let group = cfg.num_attention_heads / cfg.num_key_value_heads.max(1);
        let sm_count = usize::try_from(
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| CudaInitError::Device(e.to_string()))?,
        )
        .unwrap_or(0);
        let attention_blocks_per_sm = kernels
            .attention
            .max_active_blocks_per_sm((plan::ATTN_WARPS * 32) as u32)
            .map_err(|e| CudaInitError::Device(format!("decode attention occupancy: {e}")))?;
        let limits = StepLimits {
            max_tokens,
            max_rows,
            num_blocks,
            vocab: cfg.vocab_size,
            max_words,
            tile_tokens: if options.flash_prefill {
                plan::flash_tile_tokens(group, cfg.head_dim, major, params.flash.rows)
            } else {
                0
            },
            // Where the main kernel is the warpgroup one, tiles that fit the mma.sync geometry
            // go to the small-tile variant, and so do all of a step's tiles when its full ones
            // would not make two waves of blocks, or when it has decode rows (measured: with the
            // warpgroup launch before the decode rows' small tiles, concurrency 64 served 4-6%
            // and concurrency 256 12% fewer tokens per second; docs/benchmarks.md).
            small_tile_tokens: if options.flash_prefill && params.flash.wgmma {
                plan::flash_tile_tokens(group, cfg.head_dim, major, plan::SMALL_FLASH.rows)
            } else {
                0
            },
            min_big_tiles: options
                .warpgroup_prefill_blocks
                .unwrap_or(2 * sm_count)
                .div_ceil(cfg.num_key_value_heads.max(1)),
        };
        let waiter = StepWaiter::new(stream).map_err(|e| CudaInitError::Device(e.to_string()))?;
        let programmatic = config.programmatic_launch && major >= 9;
        let choices = kernels::cache_dir().and_then(|dir| {
            product_choice_store(&dir, name, &cache_keys, programmatic)
                .inspect_err(|e| tracing::warn!(error = %e, "product choices not stored"))
                .ok()
        });
        Ok(DeviceParts {
            kernels,
            compile: t_compile,
            kernels_ready: t_kernels,
            gemm,
            act,
            kv,
            kv_shape,
            limits,
            split_budget,
            attention_blocks: sm_count * attention_blocks_per_sm as usize,
            graph_split_context: max_context_model.min(plan::GRAPH_SPLIT_CONTEXT),
            max_words,
            waiter,
            choices,
        })
    }

    /// Chooses the small-M product paths and, when `graphs`, captures the decode graphs (and,
    /// when `mixed` too, the mixed-step segment graphs), recording how long each took.
    fn choose_and_capture(&mut self, graphs: bool, mixed: bool) -> Result<(), BackendError> {
        let choose_started = Instant::now();
        self.choose_small_m_products()?;
        self.phases.gemm_selection = choose_started.elapsed();
        tracing::info!(
            choose_ms = self.phases.gemm_selection.as_millis() as u64,
            "product paths chosen"
        );
        let capture_started = Instant::now();
        if graphs {
            self.capture_decode_graphs()?;
            tracing::info!(
                buckets = ?self.graphs.buckets(),
                capture_ms = capture_started.elapsed().as_millis() as u64,
                "decode graphs captured"
            );
            if mixed {
                let mixed_started = Instant::now();
                self.capture_mixed_step_graphs()?;
                tracing::info!(
                    buckets = ?self.mixed.buckets(),
                    capture_ms = mixed_started.elapsed().as_millis() as u64,
                    "mixed-step segment graphs captured"
                );
            }
        } else {
            tracing::info!("decode graphs off: every step runs eagerly");
        }
        self.phases.graphs = capture_started.elapsed();
        Ok(())
    }

    /// How long each start-up phase took (kernel compilation overlapped the upload).
    pub fn startup_phases(&self) -> BackendPhases {
        self.phases
    }

    /// Records what `record` launches on the stream as a CUDA graph and instantiates it (`what`
    /// names the graph in an error). Returns the graph and when the recording ended; the time
    /// after that went to instantiation.
    fn capture(
        &mut self,
        what: impl FnOnce() -> String,
        record: impl FnOnce(&mut Self) -> Result<(), BackendError>,
    ) -> Result<(CudaGraph, Instant), BackendError> {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(dev("beginning graph capture"))?;
        let recorded = record(self);
        let recorded_at = Instant::now();
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(dev("ending graph capture"));
        recorded?;
        let graph = graph?
            .ok_or_else(|| BackendError::Device(format!("capturing {}: empty graph", what())))?;
        Ok((graph, recorded_at))
    }

    /// Captures the decode forward pass for every batch-size bucket. Each bucket first runs
    /// once eagerly on padding inputs, so cuBLASLt plans its products and every module is
    /// loaded before capture; the graph is then uploaded so its first replay costs no set-up.
    fn capture_decode_graphs(&mut self) -> Result<(), BackendError> {
        // Where the time goes: eager warm-up, capture (recording and instantiation), upload.
        let mut took = [Duration::ZERO; 3];
        let planning_before = self.gemm.planning_time();
        for bucket in plan::graph_buckets(self.limits.max_rows) {
            let started = Instant::now();
            let layout = self.copy_padding_step(Padding::DecodeRows(bucket))?;
            let splits = self.decode_graph_splits(bucket);
            self.forward(&layout, splits)?;
            self.stream.synchronize().map_err(dev("graph warm-up"))?;
            let warmed = Instant::now();
            let (graph, _) = self.capture(
                || format!("the decode step of {bucket} rows"),
                |backend| backend.forward(&layout, splits),
            )?;
            let instantiated = Instant::now();
            let graph = StepGraph::new(graph);
            graph.upload().map_err(dev("uploading a graph"))?;
            self.graphs.push(bucket, graph);
            took[0] += warmed - started;
            took[1] += instantiated - warmed;
            took[2] += instantiated.elapsed();
        }
        self.stream.synchronize().map_err(dev("graph upload"))?;
        let [warm_up, capture, upload] = took.map(|d| d.as_millis() as u64);
        tracing::info!(
            warm_up_ms = warm_up,
            of_it_planning_ms = (self.gemm.planning_time() - planning_before).as_millis() as u64,
            capture_ms = capture,
            upload_ms = upload,
            "decode graphs: where the capture time went"
        );
        Ok(())
    }

    /// Captures the segments of the forward pass between attention launches (see `graphs.rs`)
    /// for every token-count bucket. Each bucket's products are first run once eagerly (segment
    /// 1 holds every product shape but the LM head's), so cuBLASLt plans them and loads their
    /// kernels before capture; each graph is uploaded after capture.
    fn capture_mixed_step_graphs(&mut self) -> Result<(), BackendError> {
        let layers = self.weights.layers.len();
        // Where the time goes: eager warm-up, recording the launches, instantiation, upload.
        let mut took = [Duration::ZERO; 4];
        let planning_before = self.gemm.planning_time();
        for bucket in plan::mixed_step_buckets(self.limits.max_tokens) {
            let started = Instant::now();
            let layout = self.copy_padding_step(Padding::Tokens(bucket))?;
            self.segment(&layout, 1)?;
            self.stream.synchronize().map_err(dev("graph warm-up"))?;
            took[0] += started.elapsed();
            let mut segments = Vec::with_capacity(layers + 1);
            for segment in 0..=layers {
                let started = Instant::now();
                let (graph, recorded) = self.capture(
                    || format!("segment {segment} of a {bucket}-token step"),
                    |backend| backend.segment(&layout, segment),
                )?;
                let instantiated = Instant::now();
                let graph = StepGraph::new(graph);
                graph.upload().map_err(dev("uploading a graph"))?;
                took[1] += recorded - started;
                took[2] += instantiated - recorded;
                took[3] += instantiated.elapsed();
                segments.push(graph);
            }
            self.mixed.push(bucket, segments);
        }
        self.stream.synchronize().map_err(dev("graph upload"))?;
        let [warm_up, record, instantiate, upload] = took.map(|d| d.as_millis() as u64);
        tracing::info!(
            warm_up_ms = warm_up,
            of_it_planning_ms = (self.gemm.planning_time() - planning_before).as_millis() as u64,
            record_ms = record,
            instantiate_ms = instantiate,
            upload_ms = upload,
            "mixed-step segment graphs: where the capture time went"
        );
        Ok(())
    }

    /// Packs a step of nothing but `padding` and copies it to the device (the inputs of a
    /// graph's warm-up and capture).
    fn copy_padding_step(&mut self, padding: Padding) -> Result<StepLayout, BackendError> {
        let mut host = std::mem::take(&mut self.host_inputs);
        let layout = pack_step(&[], padding, &self.limits, &mut host);
        self.host_inputs = host;
        let layout = layout?;
        self.copy_inputs(0..layout.len())?;
        Ok(layout)
    }

    /// The split-K bound of the decode graph of `bucket` rows.
    fn decode_graph_splits(&self, bucket: usize) -> usize {
        self.split_bound(bucket, self.graph_split_context)
    }

    /// `plan::split_bound` for `tokens` query tokens whose longest context is `max_context`, on
    /// this model's KV heads, this backend's partial buffers and this device's wave of blocks.
    fn split_bound(&self, tokens: usize, max_context: usize) -> usize {
        plan::split_bound(
            tokens,
            self.params.num_kv_heads,
            max_context,
            self.split_budget,
            self.attention_blocks,
        )
    }

    /// How a step runs, and the padding that takes: replaying its decode bucket's graph when
    /// every row decodes one token and needs the next, and a graph was captured for that many
    /// rows; else replaying the segments of its token-count bucket, when one was captured that
    /// pads it little; else eagerly.
    fn step_path(&self, rows: &[BatchRow<'_>]) -> (StepPath, Padding) {
        let decode_only = rows
            .iter()
            .all(|r| r.tokens.len() == 1 && r.sample.is_some());
        if decode_only && let Some(bucket) = plan::bucket_for(self.graphs.buckets(), rows.len()) {
            return (
                StepPath::Decode(bucket),
                Padding::DecodeRows(bucket - rows.len()),
            );
        }
        let tokens = rows.iter().map(|r| r.tokens.len()).sum();
        match plan::mixed_bucket_for(self.mixed.buckets(), tokens) {
            Some(bucket) => (StepPath::Mixed(bucket), Padding::Tokens(bucket - tokens)),
            None => (StepPath::Eager, Padding::None),
        }
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

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` (bf16 in, fp32 out) by whichever path was measured
    /// faster for the shape at start-up.
    fn matmul(
        &mut self,
        x: DevicePtr<Bf16>,
        w: DevicePtr<Bf16>,
        out: DevicePtr<f32>,
        dims: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        self.product(self.takes_small_m(x, w, dims), (x, w, out), dims)
    }

    /// Whether the product `x[m, k] · w[n, k]ᵀ` goes to the small-M kernels: measured faster
    /// for the shape at start-up, and x and w 16-byte aligned.
    fn takes_small_m(
        &self,
        x: DevicePtr<Bf16>,
        w: DevicePtr<Bf16>,
        dims: (usize, usize, usize),
    ) -> bool {
        (x.addr() | w.addr()).is_multiple_of(16) && self.gemm.uses_small_m(dims)
    }

    /// The launch of a small-M entry for `m` rows of x over a product of `n` weight rows, in the
    /// geometry of its path (`plan::gemv_geometry`): one block per `rows` weight rows (the fused
    /// entries' widths are whole numbers of blocks, `plan::swiglu_fuses` and
    /// `plan::rope_write_fuses`).
    fn small_m_shape(&self, m: usize, n: usize) -> Result<LaunchShape, BackendError> {
        let geometry = self.params.gemv_geometry(m);
        Ok(LaunchShape::new(
            (to_u32(n.div_ceil(geometry.rows), "product rows")?, 1, 1),
            geometry.threads as u32,
        )
        .with_shared(geometry.shared_bytes as u32))
    }

    /// One product by the small-M kernel (`small_m`, which `plan::small_m_fits` must allow and
    /// whose x and w must be 16-byte aligned) or by cuBLASLt.
    fn product(
        &mut self,
        small_m: bool,
        (x, w, out): (DevicePtr<Bf16>, DevicePtr<Bf16>, DevicePtr<f32>),
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        if small_m {
            return self.launch(
                &self.kernels.gemv[m - 1],
                self.small_m_shape(m, n)?,
                Gemv {
                    x,
                    w,
                    out,
                    n: to_u32(n, "product rows")? as i32,
                    k: to_u32(k, "product depth")? as i32,
                },
            );
        }
        let stream = self.stream.cu_stream() as cudarc::cublaslt::sys::cudaStream_t;
        self.gemm
            .matmul(stream, (x.addr(), w.addr(), out.addr()), (m, n, k))
    }

    /// Times the small-M kernels against cuBLASLt for every product shape of a decode step of
    /// up to `plan::GEMV_MAX_M` rows, on the model's own weights (cycling through the layers so
    /// the weights come from memory, as in a step), and records the faster path per shape; or,
    /// unless `options.measure_products`, the small-M kernel wherever it fits. Shapes whose
    /// choice is stored for this GPU, its libraries and kernels (`choices.rs`) are not timed
    /// again; the choices are stored when any was. The gate/up and q/k/v products are timed
    /// with the work that follows them in a step (SwiGLU, the rope write), which the small-M
    /// path folds into its epilogue where it can, and in a CUDA graph, as decode steps run
    /// them: what is compared is what a step would run.
    fn choose_small_m_products(&mut self) -> Result<(), BackendError> {
        const REPS: usize = 8;
        // Layers cycled through per timing: enough that no weight is read from L2 twice.
        const TIMED_LAYERS: usize = 16;
        // Padding tokens (no cache slot) give the rope write its positions and slots.
        let max_tokens = plan::GEMV_MAX_M.min(self.limits.max_tokens);
        let padding = self.copy_padding_step(Padding::Tokens(max_tokens))?;
        let p = self.params.clone();
        let qkv_n = (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim;
        let q_width = p.num_q_heads * p.head_dim;
        let layers = &self.weights.layers;
        let per_layer = |f: fn(&LayerWeights) -> DevicePtr<Bf16>| layers.iter().map(f).collect();
        let (normed, attn, mlp) = (
            self.act.normed.device_ptr(),
            self.act.attn.device_ptr(),
            self.act.mlp.device_ptr(),
        );
        let max_m = self.limits.max_tokens;
        let products = vec![
            TimedShape {
                what: TimedProduct::QkvRopeWrite,
                x: normed,
                weights: per_layer(|w| w.qkv.device_ptr()),
                n: qkv_n,
                k: p.hidden,
                max_m: max_tokens,
            },
            TimedShape {
                what: TimedProduct::Plain {
                    out: self.act.delta.device_ptr(),
                },
                x: attn,
                weights: per_layer(|w| w.o_proj.device_ptr()),
                n: p.hidden,
                k: q_width,
                max_m,
            },
            TimedShape {
                what: TimedProduct::GateUpSwiglu,
                x: normed,
                weights: per_layer(|w| w.gate_up.device_ptr()),
                n: 2 * p.intermediate,
                k: p.hidden,
                max_m,
            },
            TimedShape {
                what: TimedProduct::Plain {
                    out: self.act.delta.device_ptr(),
                },
                x: mlp,
                weights: per_layer(|w| w.down.device_ptr()),
                n: p.hidden,
                k: p.intermediate,
                max_m,
            },
            TimedShape {
                what: TimedProduct::Plain {
                    out: self.act.logits.device_ptr(),
                },
                x: normed,
                weights: vec![self.weights.lm_head_ptr()],
                n: p.vocab,
                k: p.hidden,
                max_m: self.limits.max_rows,
            },
        ];
        let measure = self.options.measure_products;
        let stored = match (&self.choices, measure) {
            (Some(store), true) => store.load(),
            _ => HashMap::new(),
        };
        let mut chosen = Vec::new();
        let mut timed = 0;
        let mut kernel_total = std::time::Duration::ZERO;
        let mut best_total = std::time::Duration::ZERO;
        for TimedShape {
            what,
            x,
            weights,
            n,
            k,
            max_m,
        } in products
        {
            for m in 1..=plan::GEMV_MAX_M.min(max_m) {
                let fits = plan::small_m_fits(m, n, k)
                    && weights
                        .iter()
                        .all(|w| (w.addr() | x.addr()).is_multiple_of(16));
                if !fits || !measure {
                    self.gemm.record_small_m((m, n, k), fits);
                    continue;
                }
                let shape = ChosenShape {
                    product: what.name().to_string(),
                    m,
                    n,
                    k,
                };
                if let Some(&kernel_faster) = stored.get(&shape) {
                    self.gemm.record_small_m((m, n, k), kernel_faster);
                    chosen.push((shape, kernel_faster));
                    continue;
                }
                let run = |backend: &mut Self, small_m: bool, i: usize| {
                    let layer = i % weights.len();
                    match what {
                        TimedProduct::Plain { out } => {
                            backend.product(small_m, (x, weights[layer], out), (m, n, k))
                        }
                        TimedProduct::GateUpSwiglu => {
                            backend.gate_up_swiglu(small_m, weights[layer], m)
                        }
                        TimedProduct::QkvRopeWrite => {
                            backend.qkv_rope_write(small_m, layer, &padding, m)
                        }
                    }
                };
                let reps = REPS.max(weights.len().min(TIMED_LAYERS));
                let mut took = [std::time::Duration::ZERO; 2];
                for (path, small_m) in [(0, true), (1, false)] {
                    took[path] = self.time_in_graph(reps, |backend, i| run(backend, small_m, i))?;
                }
                self.gemm.record_small_m((m, n, k), took[0] < took[1]);
                chosen.push((shape, took[0] < took[1]));
                timed += 1;
                if m == 1 {
                    kernel_total += took[0];
                    best_total += took[0].min(took[1]);
                }
            }
        }
        if timed > 0
            && let Some(store) = &self.choices
            && let Err(e) = store.save(&chosen)
        {
            tracing::warn!(error = %e, "could not store the product choices");
        }
        tracing::info!(
            small_m_shapes = self.gemm.small_m_shapes(),
            timed,
            stored = chosen.len() - timed,
            batch1_kernel_us = kernel_total.as_micros() as u64,
            batch1_best_us = best_total.as_micros() as u64,
            "small-M products measured against cuBLASLt (timed ones; the others as stored)"
        );
        Ok(())
    }

    /// Wall time of one replay of `run(self, 0..reps)` captured as a CUDA graph, as decode steps
    /// launch products (in a graph, with programmatic launch, the gaps between kernels are not a
    /// stream's). `run` first goes twice eagerly (so cuBLASLt plans outside the capture), and the
    /// graph is uploaded and replayed once before the timed replay.
    fn time_in_graph(
        &mut self,
        reps: usize,
        mut run: impl FnMut(&mut Self, usize) -> Result<(), BackendError>,
    ) -> Result<Duration, BackendError> {
        for i in 0..2 {
            run(self, i)?;
        }
        let (graph, _) = self.capture(
            || "a product timing".to_string(),
            |backend| (0..reps).try_for_each(|i| run(backend, i)),
        )?;
        graph.upload().map_err(dev("uploading a product timing"))?;
        graph.launch().map_err(dev("product timing"))?;
        self.stream.synchronize().map_err(dev("product timing"))?;
        let started = Instant::now();
        graph.launch().map_err(dev("product timing"))?;
        self.stream.synchronize().map_err(dev("product timing"))?;
        Ok(started.elapsed())
    }

    /// Attention of one layer into `act.attn`: the tiled prefill kernel when the step carries
    /// prefill tiles, else the paged split-K kernel and, when a token may take more than one
    /// partition, its reduction.
    fn attention(
        &self,
        layout: &StepLayout,
        layer: usize,
        splits: usize,
        scale: f32,
    ) -> Result<(), BackendError> {
        let p = &self.params;
        let t32 = to_u32(layout.num_tokens, "tokens")?;
        if layout.num_tiles > 0 {
            let splits = plan::prefill_splits(
                layout.num_tiles,
                p.num_kv_heads,
                layout.max_context,
                self.split_budget / layout.num_tokens.max(1),
            );
            // The tiles that need the full geometry, then the small ones (packed last) in the
            // small-tile variant; one split count for both, so one reduction merges them.
            let args = |first_tile: usize| PrefillAttention {
                reads: self.paged_reads(layer, layout),
                tiles: self.input(layout.tiles() + 2 * first_tile),
                scale,
                splits: splits as i32,
                out: self.act.attn.device_ptr(),
                part_acc: self.act.part_acc.device_ptr(),
                part_ml: self.act.part_ml.device_ptr(),
            };
            let big = layout.num_tiles - layout.num_small_tiles;
            let kv_heads = to_u32(p.num_kv_heads, "kv heads")?;
            let z = to_u32(splits, "splits")?;
            if big > 0 {
                self.launch(
                    &self.kernels.prefill_attention,
                    LaunchShape::new(
                        (to_u32(big, "tiles")?, kv_heads, z),
                        to_u32(p.flash.threads(), "threads")?,
                    )
                    .with_shared(to_u32(p.flash.shared_bytes, "shared bytes")?),
                    args(0),
                )?;
            }
            if layout.num_small_tiles > 0 {
                self.launch(
                    &self.kernels.prefill_attention_small,
                    LaunchShape::new(
                        (to_u32(layout.num_small_tiles, "tiles")?, kv_heads, z),
                        to_u32(plan::SMALL_FLASH.threads(), "threads")?,
                    ),
                    args(big),
                )?;
            }
            return if splits > 1 {
                self.reduce_attention(layout, splits, true)
            } else {
                Ok(())
            };
        }
        self.launch(
            &self.kernels.attention,
            LaunchShape::new(
                (
                    t32,
                    to_u32(p.num_kv_heads, "kv heads")?,
                    to_u32(splits, "splits")?,
                ),
                (plan::ATTN_WARPS * 32) as u32,
            ),
            PagedAttention {
                reads: self.paged_reads(layer, layout),
                part_acc: self.act.part_acc.device_ptr(),
                part_ml: self.act.part_ml.device_ptr(),
                merge_counts: self.act.merge_counts.device_ptr(),
                splits: splits as i32,
                scale,
                out: self.act.attn.device_ptr(),
            },
        )?;
        // With one partition per token, or few, the kernel wrote the output itself.
        if splits > plan::ATTN_MERGE_SPLITS {
            self.reduce_attention(layout, splits, false)
        } else {
            Ok(())
        }
    }

    /// What both attention kernels read for `layer` in the step of `layout`.
    fn paged_reads(&self, layer: usize, layout: &StepLayout) -> PagedReads {
        PagedReads {
            q: self.act.q.device_ptr(),
            k_cache: self.kv.keys(layer),
            v_cache: self.kv.values(layer),
            block_tables: self.input(layout.block_tables()),
            max_blocks_word: self.input(layout.max_blocks_word()),
            token_row: self.input(layout.token_rows()),
            positions: self.input(layout.positions()),
        }
    }

    /// Word `offset` of the step's packed inputs on the device.
    fn input(&self, offset: usize) -> DevicePtr<i32> {
        self.act.inputs.device_ptr_at(offset * 4)
    }

    /// Merges the split partial results of one attention launch into `act.attn`: each token's
    /// own count of splits (the paged kernel's), or all `splits` (the prefill kernel's).
    fn reduce_attention(
        &self,
        layout: &StepLayout,
        splits: usize,
        all_splits: bool,
    ) -> Result<(), BackendError> {
        self.launch(
            &self.kernels.attention_reduce,
            LaunchShape::new(
                (
                    to_u32(layout.num_tokens, "tokens")?,
                    to_u32(self.params.num_q_heads, "q heads")?,
                    1,
                ),
                plan::ATTN_REDUCE_THREADS as u32,
            ),
            AttentionReduce {
                part_acc: self.act.part_acc.device_ptr(),
                part_ml: self.act.part_ml.device_ptr(),
                positions: self.input(layout.positions()),
                splits: splits as i32,
                all_splits: i32::from(all_splits),
                out: self.act.attn.device_ptr(),
            },
        )
    }

    /// Runs the layers over the packed step, with at most `splits` split-K partitions per token
    /// in attention, and leaves the logits of the sampled rows in `act.logits`.
    fn forward(&mut self, layout: &StepLayout, splits: usize) -> Result<(), BackendError> {
        let scale = self.attention_scale();
        self.segment(layout, 0)?;
        for layer in 0..self.weights.layers.len() {
            self.attention(layout, layer, splits, scale)?;
            self.segment(layout, layer + 1)?;
        }
        self.logits(layout)
    }

    /// [`CudaBackend::forward`] of a step padded to `bucket` tokens, replaying the bucket's
    /// segment graphs between the attention launches.
    fn forward_mixed(
        &mut self,
        layout: &StepLayout,
        bucket: usize,
        splits: usize,
    ) -> Result<(), BackendError> {
        let scale = self.attention_scale();
        let replay = |segment: &StepGraph| segment.replay().map_err(dev("replaying a segment"));
        let segments = self.mixed.get(bucket)?;
        let (first, rest) = segments
            .split_first()
            .ok_or_else(|| BackendError::Device(format!("no segments for {bucket}-token steps")))?;
        replay(first)?;
        for (layer, segment) in rest.iter().enumerate() {
            self.attention(layout, layer, splits, scale)?;
            replay(segment)?;
        }
        self.mixed.count_replay();
        self.logits(layout)
    }

    /// The attention softmax scale, 1/√head_dim.
    fn attention_scale(&self) -> f32 {
        1.0 / (self.params.head_dim as f32).sqrt()
    }

    /// Queues segment `segment` of the forward pass, the launches between two attention
    /// launches: segment 0 embeds the tokens; segment `l` (from 1) finishes layer `l - 1` after
    /// its attention (output projection, norm, MLP); every segment below the layer count then
    /// starts layer `segment` up to its attention (norm, q/k/v product, rotary embedding, cache
    /// write). A segment reads only the token-indexed inputs, whose offsets depend on the
    /// step's token count alone, so it can be captured once per token count.
    fn segment(&mut self, layout: &StepLayout, segment: usize) -> Result<(), BackendError> {
        let p = self.params.clone();
        let t = layout.num_tokens;
        let t32 = to_u32(t, "tokens")?;
        let qkv_n = (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim;
        let q_width = p.num_q_heads * p.head_dim;
        let layers = self.weights.layers.len();
        let (normed, delta) = (self.act.normed.device_ptr(), self.act.delta.device_ptr());

        if segment == 0 {
            self.launch(
                &self.kernels.embedding,
                LaunchShape::new((t32, 1, 1), 256),
                EmbeddingGather {
                    table: self.weights.embed.device_ptr(),
                    tokens: self.input(layout.tokens()),
                    residual: self.act.residual.device_ptr(),
                },
            )?;
        } else {
            let w: &LayerWeights = &self.weights.layers[segment - 1];
            let (o_w, post_norm, gate_up_w, down_w) = (
                w.o_proj.device_ptr(),
                w.post_norm.device_ptr(),
                w.gate_up.device_ptr(),
                w.down.device_ptr(),
            );
            let attn = self.act.attn.device_ptr();
            self.matmul(attn, o_w, delta, (t, p.hidden, q_width))?;
            self.add_rmsnorm(t32, Some(delta), post_norm, None)?;
            let gate_up_dims = (t, 2 * p.intermediate, p.hidden);
            let small_m = self.takes_small_m(normed, gate_up_w, gate_up_dims);
            self.gate_up_swiglu(small_m, gate_up_w, t)?;
            let mlp = self.act.mlp.device_ptr();
            self.matmul(mlp, down_w, delta, (t, p.hidden, p.intermediate))?;
        }
        if segment == layers {
            return Ok(());
        }
        let layer = segment;
        let w: &LayerWeights = &self.weights.layers[layer];
        let (input_norm, qkv_w) = (w.input_norm.device_ptr(), w.qkv.device_ptr());
        // Layer 0 normalises the embeddings alone; later layers add the previous MLP's output.
        let previous = (layer > 0).then_some(delta);
        self.add_rmsnorm(t32, previous, input_norm, None)?;
        let small_m = self.takes_small_m(normed, qkv_w, (t, qkv_n, p.hidden));
        self.qkv_rope_write(small_m, layer, layout, t)
    }

    /// The gate/up product of `t` rows of `act.normed` with SwiGLU applied, into `act.mlp`: by
    /// the small-M kernels (`small_m`, which `plan::small_m_fits` and 16-byte alignment must
    /// allow; their SwiGLU entry where `plan::swiglu_fuses`) or by cuBLASLt, then the SwiGLU
    /// kernel unless the product applied it.
    fn gate_up_swiglu(
        &mut self,
        small_m: bool,
        gate_up_w: DevicePtr<Bf16>,
        t: usize,
    ) -> Result<(), BackendError> {
        let (hidden, intermediate) = (self.params.hidden, self.params.intermediate);
        let (normed, mlp) = (self.act.normed.device_ptr(), self.act.mlp.device_ptr());
        if small_m && plan::swiglu_fuses(intermediate) {
            return self.launch(
                &self.kernels.gemv_swiglu[t - 1],
                self.small_m_shape(t, 2 * intermediate)?,
                GemvSwiglu {
                    x: normed,
                    w: gate_up_w,
                    out: mlp,
                    k: to_u32(hidden, "product depth")? as i32,
                },
            );
        }
        let gate_up = self.act.gate_up.device_ptr();
        self.product(
            small_m,
            (normed, gate_up_w, gate_up),
            (t, 2 * intermediate, hidden),
        )?;
        let per_thread = plan::swiglu_vector(intermediate);
        self.launch(
            &self.kernels.swiglu,
            LaunchShape::new(
                (
                    to_u32(
                        (intermediate / per_thread).div_ceil(plan::SWIGLU_THREADS),
                        "intermediate",
                    )?,
                    to_u32(t, "tokens")?,
                    1,
                ),
                plan::SWIGLU_THREADS as u32,
            ),
            Swiglu { gate_up, out: mlp },
        )
    }

    /// The q/k/v product of the first `t` tokens of `layout` (rows of `act.normed`) with layer
    /// `layer`'s weights, then bias, per-head norm, rotary embedding, q into `act.q` and k and v
    /// into their cache slots: by the small-M kernels (`small_m`, as for
    /// [`Self::gate_up_swiglu`]; their rope-write entry where `plan::rope_write_fuses`) or by
    /// cuBLASLt, then the rope-write kernel unless the product did that work.
    fn qkv_rope_write(
        &mut self,
        small_m: bool,
        layer: usize,
        layout: &StepLayout,
        t: usize,
    ) -> Result<(), BackendError> {
        let p = &self.params;
        let (hidden, head_dim) = (p.hidden, p.head_dim);
        let heads = p.num_q_heads + 2 * p.num_kv_heads;
        let fused = small_m && plan::rope_write_fuses(head_dim, p.qk_norm);
        let normed = self.act.normed.device_ptr();
        let w: &LayerWeights = &self.weights.layers[layer];
        let qkv_w = w.qkv.device_ptr();
        let bias = w.qkv_bias.as_ref().map(DeviceBuffer::device_ptr);
        let (q_norm, k_norm) = (
            w.q_norm.as_ref().map(DeviceBuffer::device_ptr),
            w.k_norm.as_ref().map(DeviceBuffer::device_ptr),
        );
        let writes = RopeWrites {
            inv_freq: self.weights.inv_freq.device_ptr(),
            positions: self.input(layout.positions()),
            slots: self.input(layout.slots()),
            q_out: self.act.q.device_ptr(),
            k_cache: self.kv.keys(layer),
            v_cache: self.kv.values(layer),
        };
        if fused {
            return self.launch(
                &self.kernels.gemv_qkv_rope[t - 1],
                self.small_m_shape(t, heads * head_dim)?,
                GemvQkvRope {
                    x: normed,
                    w: qkv_w,
                    bias,
                    writes,
                    k: to_u32(hidden, "product depth")? as i32,
                },
            );
        }
        let qkv = self.act.qkv.device_ptr();
        self.product(small_m, (normed, qkv_w, qkv), (t, heads * head_dim, hidden))?;
        self.launch(
            &self.kernels.qkv_rope,
            LaunchShape::new((to_u32(t, "tokens")?, 1, 1), 32 * heads.min(32) as u32),
            QkvRopeWrite {
                qkv,
                bias,
                q_norm,
                k_norm,
                writes,
            },
        )
    }

    /// Adds `delta` (if any) to the residual stream and writes its RMS norm with `weight` into
    /// `act.normed`, for `rows` rows: the first ones, or those listed at `row_index` (if given).
    fn add_rmsnorm(
        &self,
        rows: u32,
        delta: Option<DevicePtr<f32>>,
        weight: DevicePtr<Bf16>,
        row_index: Option<DevicePtr<i32>>,
    ) -> Result<(), BackendError> {
        self.launch(
            &self.kernels.add_rmsnorm,
            LaunchShape::new((rows, 1, 1), plan::RMS_THREADS as u32),
            AddRmsnorm {
                residual: self.act.residual.device_ptr(),
                delta,
                weight,
                rows: row_index,
                out: self.act.normed.device_ptr(),
            },
        )
    }

    /// The final norm and the LM head over the sampled rows, into `act.logits`. The product
    /// runs for as many rows as the smallest decode-graph bucket that holds them (the extra
    /// rows' logits are never read), so steps with prompt tokens reuse the product plans the
    /// decode graphs made at start-up instead of planning a new shape on first use.
    fn logits(&mut self, layout: &StepLayout) -> Result<(), BackendError> {
        let samples = layout.num_samples;
        if samples == 0 {
            return Ok(());
        }
        self.add_rmsnorm(
            to_u32(samples, "samples")?,
            Some(self.act.delta.device_ptr()),
            self.weights.final_norm.device_ptr(),
            Some(self.input(layout.sample_tokens())),
        )?;
        let rows = plan::bucket_for(self.graphs.buckets(), samples).unwrap_or(samples);
        let (normed, logits, head) = (
            self.act.normed.device_ptr(),
            self.act.logits.device_ptr(),
            self.weights.lm_head_ptr(),
        );
        self.matmul(
            normed,
            head,
            logits,
            (rows, self.params.vocab, self.params.hidden),
        )
    }

    /// Copies the words `words` of the packed inputs to the same place in the device input
    /// buffer (the caller counts the copy when it belongs to a step).
    fn copy_inputs(&mut self, words: std::ops::Range<usize>) -> Result<usize, BackendError> {
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

    /// Packs a step (with slots for its late masks), copies everything but those slots to the
    /// device and queues the forward pass; None for a step without tokens.
    fn queue_step(
        &mut self,
        rows: &[BatchRow<'_>],
        late: &[bool],
    ) -> Result<Option<QueuedStep>, BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(dev("binding the context"))?;
        let (path, padding) = self.step_path(rows);
        let mut host = std::mem::take(&mut self.host_inputs);
        let layout = pack_step_with_late_masks(rows, late, padding, &self.limits, &mut host);
        self.host_inputs = host;
        let layout = layout?;
        self.copies.steps += 1;
        if layout.is_empty() {
            return Ok(None);
        }
        let queued = Instant::now();
        let bytes = self.copy_inputs(0..layout.late_mask_slots())?;
        self.copies.record_h2d(bytes);
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
    fn finish_queued(
        &mut self,
        step: QueuedStep,
        rows: &[BatchRow<'_>],
    ) -> Result<StepOutput, BackendError> {
        let QueuedStep {
            layout,
            bucket,
            queued,
            late,
        } = step;
        if layout.late_masks > 0 {
            let slots = fill_late_masks(rows, &late, &layout, &mut self.host_inputs)?;
            let bytes = self.copy_inputs(slots)?;
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
        let specs = rows.iter().filter_map(|r| r.sample.as_ref());
        let tokens = words
            .chunks_exact(SAMPLE_STRIDE)
            .zip(specs)
            .map(|(w, spec)| SampledToken {
                token: w[0] as u32,
                logprob: spec.logprobs.map(|k| TokenLogprob {
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
    fn settle(&mut self, bucket: Option<usize>, queued: Instant) -> Result<(), BackendError> {
        match bucket {
            Some(bucket) => self.waiter.wait(&self.stream, bucket, queued),
            None => self.waiter.wait_blocking(&self.stream),
        }
        .map_err(dev("waiting for the step"))
    }

    fn download<T: Copy + Default>(
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
        match self.queue_step(rows, &[])? {
            Some(step) => self.finish_queued(step, rows),
            None => Ok(StepOutput::Logits(Vec::new())),
        }
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
        self.started = self.queue_step(rows, late)?;
        Ok(self.started.is_some())
    }

    fn finish_step(&mut self, rows: &[BatchRow<'_>]) -> Result<StepOutput, BackendError> {
        let step = self.started.take().ok_or_else(|| {
            BackendError::InvalidBatch("finish_step without a started step".into())
        })?;
        self.finish_queued(step, rows)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Buffers are freed by their own Drop; they need this context current on this thread.
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
    }
}

impl Activations {
    fn new(
        cfg: &ModelConfig,
        max_tokens: usize,
        max_rows: usize,
        split_budget: usize,
        max_words: usize,
    ) -> Result<Self, BackendError> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let q_width = cfg.num_attention_heads * d;
        let qkv_width = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d;
        let partials = split_budget.max(max_tokens) * cfg.num_attention_heads;
        Ok(Self {
            inputs: DeviceBuffer::new(max_words * 4)?,
            residual: DeviceBuffer::new(max_tokens * h * 4)?,
            normed: DeviceBuffer::new(max_tokens * h * 2)?,
            qkv: DeviceBuffer::new(max_tokens * qkv_width * 4)?,
            q: DeviceBuffer::new(max_tokens * q_width * 2)?,
            attn: DeviceBuffer::new(max_tokens * q_width * 2)?,
            delta: DeviceBuffer::new(max_tokens * h * 4)?,
            gate_up: DeviceBuffer::new(max_tokens * 2 * cfg.intermediate_size * 4)?,
            mlp: DeviceBuffer::new(max_tokens * cfg.intermediate_size * 2)?,
            part_acc: DeviceBuffer::new(partials * d * 4)?,
            part_ml: DeviceBuffer::new(partials * 2 * 4)?,
            merge_counts: DeviceBuffer::from_bytes(&vec![
                0;
                max_tokens * cfg.num_key_value_heads * 4
            ])?,
            logits: DeviceBuffer::new(max_rows * cfg.vocab_size * 4)?,
            sampled: DeviceBuffer::new(max_rows * SAMPLE_STRIDE * 4)?,
            probs: DeviceBuffer::new(max_rows * cfg.vocab_size * 4)?,
        })
    }
}
