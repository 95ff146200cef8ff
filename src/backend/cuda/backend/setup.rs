//! Building a [`CudaBackend`]: the weights uploaded while everything else (kernels, step
//! buffers, KV cache, product choices, graphs) is built beside the upload.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};
use indicatif::ProgressBar;

use crate::backend::BackendPhases;
use crate::engine::{BackendError, EngineConfig, KvCacheShape};
use crate::model::{Model, ModelConfig, ModelDefinition, ModelTensors};

use crate::backend::cuda::early::{CopiedWeights, EarlyStats};
use crate::backend::cuda::error::CudaInitError;
use crate::backend::cuda::gemm::Gemm;
use crate::backend::cuda::graphs::{DecodeGraphs, MixedStepGraphs};
use crate::backend::cuda::inputs::{self, CopyStats, StepLimits};
use crate::backend::cuda::kernels::{self, KernelParams, SAMPLE_STRIDE};
use crate::backend::cuda::memory::DeviceBuffer;
use crate::backend::cuda::moe::MoeScratch;
use crate::backend::cuda::plan;
use crate::backend::cuda::upload::UploadStats;
use crate::backend::cuda::wait::StepWaiter;
use crate::backend::cuda::weights::ModelWeightsOnDevice;

use super::device::{LoadedKernels, OpenedDevice, Prepared, PreparingBackend, kernel_params};
use super::products::product_choice_store;
use super::{
    Activations, CudaBackend, CudaOptions, DeviceParts, Fp8Scratch, KvCache, LateMaskCopy,
};

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
        let params = KernelParams::from_definition(&model.definition());
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
        let params = kernel_params(&ctx, cfg, config.kv_cache_dtype, &arch)?;
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
                ctx,
                stream,
                weights,
                parts,
                ModelDefinition::of(cfg),
                params,
                config,
                options,
                major,
                t_context,
            );
            let prepared = backend.choose_and_capture(config.cuda_graphs, config.cuda_mixed_graphs);
            let uploaded = finish_upload(uploader);
            prepared?;
            backend.phases.weights = uploaded?;
            // The scales are read by the kernels only when a step runs (the graphs hold their
            // address): stored once the upload has been joined, so an error here frees nothing
            // a copy still targets.
            backend.write_kv_scales(model)?;
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
        backend.write_kv_scales(model)?;
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

    /// Stores an FP8 cache's per-layer k and v scales from `model` (the checkpoint's, else 1.0:
    /// `model::kv_scales`); a bf16 cache reads none.
    fn write_kv_scales(&self, model: ModelTensors<'_>) -> Result<(), CudaInitError> {
        if !self.params.kv_fp8 {
            return Ok(());
        }
        let scales = crate::model::kv_scales::kv_cache_scales(model.weights, self.kv.places.len())
            .map_err(|e| CudaInitError::Weights(e.to_string()))?;
        self.kv.write_scales(&scales)?;
        Ok(())
    }

    /// The backend from its weights and the parts built on the device; the product paths not
    /// yet chosen, no graph captured.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn from_parts(
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        weights: ModelWeightsOnDevice,
        parts: DeviceParts,
        definition: ModelDefinition,
        params: KernelParams,
        config: &EngineConfig,
        options: CudaOptions,
        major: i32,
        t_context: Duration,
    ) -> Self {
        Self {
            definition,
            graphs: DecodeGraphs::default(),
            mixed: MixedStepGraphs::default(),
            waiter: parts.waiter,
            late_copy: parts.late_copy,
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
            sm_count: parts.sm_count,
            graph_split_context: parts.graph_split_context,
            host_inputs: Vec::with_capacity(parts.max_words),
            options,
            copies: CopyStats::default(),
            started: None,
            programmatic: config.programmatic_launch && major >= 9,
            fp8_gemm: true,
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
    pub(super) fn device_parts(
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
        // The KV groups: sliding layers beside full ones keep a block table of their own, whose
        // blocks the window left go back to the pool (`engine::kv_groups`); the groups' layers
        // share the blocks' storage slots.
        let windows: Vec<Option<usize>> = crate::model::ModelDefinition::of(cfg)
            .layers
            .iter()
            .map(|l| l.attention.sliding_window)
            .collect();
        let (kv_groups, places, kv_slots) = crate::engine::kv_groups::layer_places(&windows);
        let max_words = inputs::max_words(
            max_tokens,
            max_rows,
            (kv_groups.count(), max_blocks_per_seq),
            max_penalty_tokens,
            cfg.vocab_size,
        );
        let act_started = Instant::now();
        let act = Activations::new(cfg, max_tokens, max_rows, split_budget, max_words)?;
        let t_act = act_started.elapsed();

        let (free, total) = ctx
            .mem_get_info()
            .map_err(|e| CudaInitError::Device(e.to_string()))?;
        let block_bytes = plan::kv_block_bytes(
            kv_slots,
            cfg.num_key_value_heads,
            cfg.head_dim,
            params.kv_element_bytes(),
        );
        let num_blocks = plan::kv_blocks(free, config.gpu_memory_fraction, block_bytes);
        if num_blocks == 0 {
            return Err(CudaInitError::Device(format!(
                "no room for the KV cache: {free} bytes free, gpu_memory_fraction {}",
                config.gpu_memory_fraction
            )));
        }
        let max_rows = config
            .max_num_seqs
            .unwrap_or_else(|| {
                crate::engine::derive_max_num_seqs(num_blocks, Some(buffer_rows), &kv_groups)
            })
            .max(1);
        let layer_bytes = num_blocks
            * crate::engine::BLOCK_SIZE
            * cfg.num_key_value_heads
            * cfg.head_dim
            * params.kv_element_bytes();
        let kv_started = Instant::now();
        let kv = KvCache::new(places, kv_slots, layer_bytes)?;
        let kv_alloc = kv_started.elapsed();
        let kv_shape = KvCacheShape {
            num_blocks,
            block_size: crate::engine::BLOCK_SIZE,
            groups: kv_groups,
        };
        tracing::info!(
            gpu = %name,
            arch = %arch,
            blocks = num_blocks,
            kv_groups = kv_groups.count(),
            capacity = %kv_shape.capacity_label(),
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
            .paged
            .max_active_blocks_per_sm((plan::ATTN_WARPS * 32) as u32)
            .map_err(|e| CudaInitError::Device(format!("decode attention occupancy: {e}")))?;
        let limits = StepLimits {
            max_tokens,
            max_rows,
            num_blocks,
            kv_groups,
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
            // and concurrency 256 12% fewer tokens per second; docs/cuda-backend.md, "Kernels").
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
        let late_copy =
            LateMaskCopy::new(stream).map_err(|e| CudaInitError::Device(e.to_string()))?;
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
            sm_count,
            graph_split_context: max_context_model.min(plan::GRAPH_SPLIT_CONTEXT),
            max_words,
            waiter,
            late_copy,
            choices,
        })
    }
}

impl Activations {
    pub(super) fn new(
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
            fp8: match cfg.quantization {
                Some(_) => Some(Fp8Scratch::new(cfg, max_tokens)?),
                None => None,
            },
            moe: MoeScratch::new(cfg, max_tokens)?,
        })
    }
}

impl Fp8Scratch {
    /// Buffers for the FP8 products of up to `max_tokens` rows of a model with configuration
    /// `cfg`.
    fn new(cfg: &ModelConfig, max_tokens: usize) -> Result<Self, BackendError> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let q_width = cfg.num_attention_heads * d;
        let qkv_width = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d;
        let inter = cfg.intermediate_size;
        let widest = h.max(q_width).max(inter);
        let largest = [qkv_width * h, h * q_width, 2 * inter * h, h * inter]
            .into_iter()
            .max()
            .unwrap_or(0);
        Ok(Self {
            codes: DeviceBuffer::new(max_tokens * widest)?,
            values: DeviceBuffer::new(max_tokens * widest * 2)?,
            scales: DeviceBuffer::new(max_tokens * widest.div_ceil(16) * 4)?,
            weights: DeviceBuffer::new(largest * 2)?,
        })
    }
}
