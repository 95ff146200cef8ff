//! Matrix products: the small-M kernels or cuBLASLt, chosen per shape by timing both at
//! start-up (the choices stored per GPU, libraries and kernels).

use std::time::{Duration, Instant};

use cudarc::driver::sys;

use crate::engine::BackendError;

use crate::backend::cuda::choices::{ChoiceStore, ChosenShape, Stored};
use crate::backend::cuda::error::CudaInitError;
use crate::backend::cuda::fp8::{GemvGeometry, quant_chunks, quant_threads};
use crate::backend::cuda::gemm::Gemm;
use crate::backend::cuda::inputs::Padding;
use crate::backend::cuda::launch::{
    Bf16, DevicePtr, E4m3, Fp8DequantizeWeight, Fp8Gemv, Fp8QuantizeInput, Fp8ScaleOutput, Gemv,
    LaunchShape,
};
use crate::backend::cuda::plan;
use crate::backend::cuda::weights::{Fp8Operand, LayerWeights, Operand};

use super::algorithms::TunedProduct;
use super::{CudaBackend, dev, to_u32};

/// What `CudaBackend::choose_small_m_products` times with a product: the product alone, or with
/// the work a step runs after it (which the small-M path folds into its epilogue).
#[derive(Debug, Clone, Copy)]
pub(super) enum TimedProduct {
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
pub(super) fn product_choice_store(
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
pub(super) struct TimedShape {
    pub(super) what: TimedProduct,
    pub(super) x: DevicePtr<Bf16>,
    pub(super) weights: Vec<DevicePtr<Bf16>>,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) max_m: usize,
}

impl CudaBackend {
    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` (bf16 in, fp32 out) by whichever path was measured
    /// faster for the shape at start-up.
    pub(super) fn matmul(
        &mut self,
        x: DevicePtr<Bf16>,
        w: DevicePtr<Bf16>,
        out: DevicePtr<f32>,
        dims: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        self.product(self.takes_small_m(x, w, dims), (x, w, out), dims)
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` for a projection in either format: bf16 by
    /// [`Self::matmul`], FP8 by [`Self::fp8_product`].
    pub(super) fn project(
        &mut self,
        x: DevicePtr<Bf16>,
        w: Operand,
        out: DevicePtr<f32>,
        dims: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        match w {
            Operand::Bf16(w) => self.matmul(x, w, out, dims),
            Operand::Fp8(w) => self.fp8_product(x, w, out, dims, false),
        }
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` with FP8 weights: the input quantized first as the
    /// projection's scheme says (`fp8_quantize_input`); then, for at most `plan::GEMV_MAX_M`
    /// rows, the FP8 small-M kernel; for more, cuBLASLt's FP8 product of the codes and then the
    /// scales applied to its output (`fp8_scale_output`) where the scales allow it (per weight
    /// row and per token), else the weights widened to bf16
    /// into a scratch buffer and the bf16 product. With `quantized`, the norm that wrote `x`
    /// (`fp8_add_rmsnorm`) has already left the quantized input in the scratch buffers.
    pub(super) fn fp8_product(
        &mut self,
        x: DevicePtr<Bf16>,
        w: Fp8Operand,
        out: DevicePtr<f32>,
        dims: (usize, usize, usize),
        quantized: bool,
    ) -> Result<(), BackendError> {
        self.fp8_product_deferring(x, w, out, dims, quantized, false)
            .map(|_| ())
    }

    /// [`Self::fp8_product`]; with `defer_scales`, where the product is cuBLASLt's FP8 product
    /// of the codes, its scales are left for the kernel that reads it (`fp8_scale_output` does
    /// not run): returns whether they were.
    pub(super) fn fp8_product_deferring(
        &mut self,
        x: DevicePtr<Bf16>,
        w: Fp8Operand,
        out: DevicePtr<f32>,
        (m, n, k): (usize, usize, usize),
        quantized: bool,
        defer_scales: bool,
    ) -> Result<bool, BackendError> {
        if m == 0 {
            return Ok(false);
        }
        let scratch = self
            .act
            .fp8
            .as_ref()
            .ok_or_else(|| BackendError::Device("an FP8 product without its buffers".into()))?;
        let (codes, scales, widened) = (
            scratch.codes.device_ptr::<E4m3>(),
            scratch.scales.device_ptr(),
            scratch.weights.device_ptr(),
        );
        let k32 = to_u32(k, "product depth")? as i32;
        let n32 = to_u32(n, "product rows")? as i32;
        let groups = to_u32(w.groups, "scale groups")? as i32;
        let group = to_u32(w.group, "scale group")? as i32;
        let input = self.fp8_input(x, w, (m, k), quantized)?;
        if m <= plan::GEMV_MAX_M {
            let geometry = GemvGeometry::choose(m, n, k, self.sm_count);
            return self
                .launch(
                    &self.kernels.fp8_gemv[geometry.entry(m)],
                    LaunchShape::new(
                        (to_u32(geometry.blocks(n), "product rows")?, 1, 1),
                        geometry.threads(),
                    ),
                    Fp8Gemv {
                        x: input,
                        w: w.values,
                        scales: w.scales,
                        out,
                        n: n32,
                        k: k32,
                        groups,
                        group,
                        splits: to_u32(geometry.splits, "splits")? as i32,
                    },
                )
                .map(|()| false);
        }
        let stream = self.stream.cu_stream() as cudarc::cublaslt::sys::cudaStream_t;
        if w.takes_scaled_gemm(n) && self.fp8_gemm {
            let pointers = (codes.addr(), w.values.addr(), out.addr());
            match self.gemm.matmul_fp8(stream, pointers, (m, n, k)) {
                Ok(()) if defer_scales => return Ok(true),
                Ok(()) => {
                    return self
                        .launch(
                            &self.kernels.fp8_scale_output,
                            LaunchShape::new(
                                (
                                    to_u32((m * n).div_ceil(4 * 256).min(65_535), "outputs")?,
                                    1,
                                    1,
                                ),
                                256,
                            ),
                            Fp8ScaleOutput {
                                out,
                                x_scales: scales,
                                w_scales: w.scales,
                                m: to_u32(m, "tokens")? as i32,
                                n: n32,
                            },
                        )
                        .map(|()| false);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cuBLASLt's FP8 product is not available; FP8 weights are widened to bf16 for products of more than 8 rows");
                    self.fp8_gemm = false;
                }
            }
        }
        let chunks = n * k / 16;
        self.launch(
            &self.kernels.fp8_dequantize,
            LaunchShape::new(
                (to_u32(chunks.div_ceil(256).min(65_535), "chunks")?, 1, 1),
                256,
            ),
            Fp8DequantizeWeight {
                w: w.values,
                scales: w.scales,
                n: n32,
                k: k32,
                groups,
                group,
                out: widened,
            },
        )?;
        self.gemm
            .matmul(
                stream,
                (input.addr(), widened.addr(), out.addr()),
                (m, n, k),
            )
            .map(|()| false)
    }

    /// The input an FP8 product of `m` rows of `x` (`k` wide) with `w` reads: `x` itself for
    /// weight-only FP8; else the dequantized values in the FP8 scratch buffers, quantized here
    /// as `w`'s scheme says (`fp8_quantize_input`, several blocks per token and group for a
    /// decode step's rows: `fp8::quant_chunks`) unless `quantized` (the kernel that wrote `x`
    /// already left them there).
    pub(super) fn fp8_input(
        &self,
        x: DevicePtr<Bf16>,
        w: Fp8Operand,
        (m, k): (usize, usize),
        quantized: bool,
    ) -> Result<DevicePtr<Bf16>, BackendError> {
        let Some(q) = w.input else {
            return Ok(x);
        };
        let scratch = self
            .act
            .fp8
            .as_ref()
            .ok_or_else(|| BackendError::Device("an FP8 product without its buffers".into()))?;
        let values = scratch.values.device_ptr();
        if quantized {
            return Ok(values);
        }
        let width = if q.group == 0 { k } else { q.group };
        self.launch(
            &self.kernels.fp8_quantize,
            LaunchShape::new(
                (
                    to_u32(m, "tokens")?,
                    to_u32(q.groups(k), "input groups")?,
                    to_u32(quant_chunks(width, m), "input chunks")?,
                ),
                quant_threads(width),
            ),
            Fp8QuantizeInput {
                x,
                k: to_u32(k, "product depth")? as i32,
                group: to_u32(q.group, "input group")? as i32,
                upper_bound: q.upper_bound,
                static_scale: q.static_scale,
                xq: scratch.codes.device_ptr(),
                xd: values,
                scales: scratch.scales.device_ptr(),
            },
        )?;
        Ok(values)
    }

    /// Whether the product `x[m, k] · w[n, k]ᵀ` goes to the small-M kernels: measured faster
    /// for the shape at start-up, and x and w 16-byte aligned.
    pub(super) fn takes_small_m(
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
    pub(super) fn small_m_shape(&self, m: usize, n: usize) -> Result<LaunchShape, BackendError> {
        let geometry = self.params.gemv_geometry(m);
        Ok(LaunchShape::new(
            (to_u32(n.div_ceil(geometry.rows), "product rows")?, 1, 1),
            geometry.threads as u32,
        )
        .with_shared(geometry.shared_bytes as u32))
    }

    /// One product by the small-M kernel (`small_m`, which `plan::small_m_fits` must allow and
    /// whose x and w must be 16-byte aligned) or by cuBLASLt.
    pub(super) fn product(
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
    pub(super) fn choose_small_m_products(&mut self) -> Result<(), BackendError> {
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
        // FP8 projections are not timed: their small-M kernel serves every product it fits.
        let per_layer = |f: fn(&LayerWeights) -> Option<DevicePtr<Bf16>>| -> Vec<DevicePtr<Bf16>> {
            layers.iter().filter_map(f).collect()
        };
        let (normed, attn, mlp) = (
            self.act.normed.device_ptr(),
            self.act.attn.device_ptr(),
            self.act.mlp.device_ptr(),
        );
        let max_m = self.limits.max_tokens;
        let mut products = vec![
            TimedShape {
                what: TimedProduct::QkvRopeWrite,
                x: normed,
                weights: per_layer(|w| w.qkv.bf16()),
                n: qkv_n,
                k: p.hidden,
                max_m: max_tokens,
            },
            TimedShape {
                what: TimedProduct::Plain {
                    out: self.act.delta.device_ptr(),
                },
                x: attn,
                weights: per_layer(|w| w.o_proj.bf16()),
                n: p.hidden,
                k: q_width,
                max_m,
            },
            TimedShape {
                what: TimedProduct::GateUpSwiglu,
                x: normed,
                weights: per_layer(|w| w.dense()?.0.bf16()),
                n: 2 * p.intermediate,
                k: p.hidden,
                max_m,
            },
            TimedShape {
                what: TimedProduct::Plain {
                    out: self.act.delta.device_ptr(),
                },
                x: mlp,
                weights: per_layer(|w| w.dense()?.1.bf16()),
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
        // The dense products' cuBLASLt algorithms are timed at the larger step row counts.
        let tuned: Vec<TunedProduct> = products
            .iter()
            .map(|t| TunedProduct {
                name: t.what.name(),
                x: t.x,
                weights: t.weights.clone(),
                out: match t.what {
                    TimedProduct::Plain { out } => out,
                    TimedProduct::GateUpSwiglu => self.act.gate_up.device_ptr(),
                    TimedProduct::QkvRopeWrite => self.act.qkv.device_ptr(),
                },
                n: t.n,
                k: t.k,
                max_m: if matches!(t.what, TimedProduct::QkvRopeWrite) {
                    max_m
                } else {
                    t.max_m
                },
            })
            .collect();
        products.extend(self.moe_timed_shapes(max_m));
        let measure = self.options.measure_products;
        let stored = match (&self.choices, measure) {
            (Some(store), true) => store.load(),
            _ => Stored::default(),
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
            if weights.is_empty() {
                continue;
            }
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
                if let Some(&kernel_faster) = stored.small_m.get(&shape) {
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
        let (algorithms, algorithms_timed) = if measure {
            self.choose_algorithms(&tuned, &stored.algorithms)
        } else {
            (Vec::new(), 0)
        };
        if timed + algorithms_timed > 0
            && let Some(store) = &self.choices
            && let Err(e) = store.save(&chosen, &algorithms)
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
    pub(super) fn time_in_graph(
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
}
