//! Opening the GPU ahead of the model, and preparing a backend from the model's configuration
//! while its weights are read: the context and stream, the kernels compiled and loaded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError};

use crate::engine::{EngineConfig, KvCacheDtype};
use crate::model::{ModelConfig, ModelDefinition};

use crate::backend::cuda::cc;
use crate::backend::cuda::compile::{self, KernelError};
use crate::backend::cuda::early::EarlyUpload;
use crate::backend::cuda::error::CudaInitError;
use crate::backend::cuda::kernels::{self, KernelParams};
use crate::backend::cuda::launch::{Kernel, KernelArgs};
use crate::backend::cuda::plan;
use crate::backend::cuda::probe;
use crate::backend::cuda::weights::{ModelWeightsOnDevice, WeightTargets};

use super::{AttentionKernels, CudaBackend, CudaOptions, Kernels};

/// A CUDA device opened ahead of the model: the driver probed, the context and the backend's
/// stream created. Opening needs nothing from the model, so it can run on another thread while
/// the model is read or parsed, but only once the GPU may be used (after the start-up
/// attestation set its confidential-computing ready state).
pub struct OpenedDevice {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) major: i32,
    pub(super) arch: String,
    pub(super) name: String,
    pub(super) took: Duration,
    pub(super) early: Option<Arc<EarlyUpload>>,
    pub(super) preparing: Option<Box<PreparingBackend>>,
}

/// A backend being built from a model's configuration before its weights were read, on a
/// thread of its own: every buffer, the KV cache, the product paths and the decode graphs; the
/// weights' buffers exist from the start, their contents undefined.
pub(super) struct PreparingBackend {
    /// Where each tensor goes in the weights.
    pub(super) targets: WeightTargets,
    /// What it is built for: used only for a model, engine and options equal to these.
    pub(super) model: ModelConfig,
    pub(super) engine: EngineConfig,
    pub(super) options: CudaOptions,
    pub(super) build: std::thread::JoinHandle<Prepared>,
}

/// How the preparation ended.
pub(super) enum Prepared {
    Ready(Box<CudaBackend>),
    /// The error, and what was built (the weights among it), to be freed only once nothing
    /// copies into the weights any more.
    Failed(CudaInitError, Box<dyn Send>),
}

/// The kernels compiled (or taken from the cache) and loaded for one set of parameters.
pub(super) struct LoadedKernels {
    pub(super) kernels: Kernels,
    /// Every family's cache key, in `kernels::FAMILIES` order.
    pub(super) cache_keys: Vec<String>,
    /// Compilation (or the cache).
    pub(super) compile: Duration,
    /// Compilation and module loading.
    pub(super) ready: Duration,
}

impl LoadedKernels {
    /// Compiles and loads every entry point for `params` in `ctx` (bound to this thread), with
    /// the shared-memory opt-ins the larger ones need.
    pub(super) fn load(
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
            for set in std::iter::once(&kernels.attention).chain(&kernels.attention_full) {
                set.prefill
                    .allow_dynamic_shared(params.flash.shared_bytes)
                    .map_err(|e| {
                        CudaInitError::Device(format!("prefill attention shared memory: {e}"))
                    })?;
            }
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
        if let Some(moe) = &kernels.moe {
            moe.allow_dynamic_shared(params.gemv_geometry(1).shared_bytes)
                .map_err(|e| CudaInitError::Device(format!("expert product shared memory: {e}")))?;
        }
        Ok(Self {
            kernels,
            cache_keys,
            compile,
            ready: started.elapsed(),
        })
    }
}

/// The kernel parameters of `cfg` with a KV cache of `kv_dtype` on the device of `ctx`
/// (architecture `arch`); an FP8 cache is refused below compute capability 8.9.
pub(super) fn kernel_params(
    ctx: &Arc<CudaContext>,
    cfg: &ModelConfig,
    kv_dtype: KvCacheDtype,
    arch: &str,
) -> Result<KernelParams, CudaInitError> {
    if kv_dtype == KvCacheDtype::Fp8 && !kernels::arch_converts_e4m3(arch) {
        return Err(CudaInitError::Unsupported(format!(
            "an FP8 KV cache needs compute capability 8.9 or newer (this GPU is {arch})"
        )));
    }
    let shared_per_block = usize::try_from(
        ctx.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
        .map_err(|e| CudaInitError::Device(format!("shared memory per block: {e}")))?,
    )
    .unwrap_or(0);
    Ok(KernelParams::from_definition(&ModelDefinition::of(cfg))
        .with_kv_cache(kv_dtype)
        .for_device(arch, shared_per_block))
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
        let params = kernel_params(&self.ctx, model, engine.kv_cache_dtype, &self.arch)?;
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
                    ModelDefinition::of(&model_config),
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

impl Kernels {
    pub(super) fn take(mut map: HashMap<&'static str, CudaFunction>) -> Result<Self, KernelError> {
        let map = &mut map;
        Ok(Self {
            embedding: Kernel::take(map, "embedding_gather")?,
            add_rmsnorm: Kernel::take(map, "add_rmsnorm")?,
            qkv_rope: Kernel::take(map, "qkv_rope_write")?,
            attention: AttentionKernels::take(map, &kernels::ATTENTION_ENTRIES)?,
            attention_full: match map.contains_key(kernels::ATTENTION_FULL_ENTRIES[0]) {
                true => Some(AttentionKernels::take(
                    map,
                    &kernels::ATTENTION_FULL_ENTRIES,
                )?),
                false => None,
            },
            swiglu: Kernel::take(map, "swiglu")?,
            sample: Kernel::take(map, "sample_tokens")?,
            gemv: take_each(map, &kernels::GEMV_ENTRIES)?,
            gemv_swiglu: take_each(map, &kernels::GEMV_SWIGLU_ENTRIES)?,
            gemv_qkv_rope: take_each(map, &kernels::GEMV_QKV_ROPE_ENTRIES)?,
            fp8_quantize: Kernel::take(map, "fp8_quantize_input")?,
            fp8_dequantize: Kernel::take(map, "fp8_dequantize_weight")?,
            fp8_add_rmsnorm: Kernel::take(map, "fp8_add_rmsnorm")?,
            fp8_swiglu_quantize: Kernel::take(map, "fp8_swiglu_quantize")?,
            fp8_scale_output: Kernel::take(map, "fp8_scale_output")?,
            fp8_gemv: take_each(map, &kernels::FP8_GEMV_ENTRIES)?,
            qkv_rope_scaled: Kernel::take(map, "qkv_rope_write_scaled")?,
            fp8_gemv_swiglu: take_each(map, &kernels::FP8_GEMV_SWIGLU_ENTRIES)?,
            fp8_gemv_qkv_rope: take_each(map, &kernels::FP8_GEMV_QKV_ROPE_ENTRIES)?,
            moe: super::moe::MoeKernels::take(map)?,
            gpt_oss: super::gpt_oss::GptOssKernels::take(map)?,
        })
    }
}

impl AttentionKernels {
    /// The paged, reduce, prefill and small prefill entry points named `entries`.
    fn take(
        map: &mut HashMap<&'static str, CudaFunction>,
        entries: &[&'static str; 4],
    ) -> Result<Self, KernelError> {
        Ok(Self {
            paged: Kernel::take(map, entries[0])?,
            reduce: Kernel::take(map, entries[1])?,
            prefill: Kernel::take(map, entries[2])?,
            prefill_small: Kernel::take(map, entries[3])?,
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
