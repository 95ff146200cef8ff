//! The forward pass: the model definition's layers as kernel launches and products on the
//! backend's stream, segment by segment between the attention launches.

use crate::engine::BackendError;
use crate::model::{ExpertKind, MlpDefinition};

use crate::backend::cuda::fp8::{GemvGeometry, quant_threads};
use crate::backend::cuda::graphs::StepGraph;
use crate::backend::cuda::inputs::StepLayout;
use crate::backend::cuda::launch::{
    AddRmsnorm, AttentionReduce, Bf16, DevicePtr, EmbeddingGather, Fp8AddRmsnorm, Fp8GemvQkvRope,
    Fp8GemvSwiglu, Fp8SwigluQuantize, GemvQkvRope, GemvSwiglu, LaunchShape, PagedAttention,
    PagedReads, PrefillAttention, QkvRopeWrite, QkvRopeWriteScaled, RopeWrites, Swiglu,
};
use crate::backend::cuda::memory::DeviceBuffer;
use crate::backend::cuda::plan;
use crate::backend::cuda::weights::{Fp8Operand, LayerWeights, Operand};

use super::{AttentionKernels, CudaBackend, dev, to_u32};

impl CudaBackend {
    /// Runs the layers over the packed step, with at most `splits` split-K partitions per token
    /// in attention, and leaves the logits of the sampled rows in `act.logits`.
    pub(super) fn forward(
        &mut self,
        layout: &StepLayout,
        splits: usize,
    ) -> Result<(), BackendError> {
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
    pub(super) fn forward_mixed(
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

    /// The attention softmax scale, 1/√head_dim, times the square of YaRN's attention factor
    /// (transformers scales the rotated q and k by it; the kernels scale their product).
    fn attention_scale(&self) -> f32 {
        let attention = self.definition.attention();
        let factor = attention.rope.attention_factor();
        attention.scale() * factor * factor
    }

    /// The attention kernels of `layer`: those without the window for a full layer of a model
    /// whose other layers slide.
    fn attention_kernels(&self, layer: usize) -> &AttentionKernels {
        match (
            &self.kernels.attention_full,
            self.definition.layers[layer].attention.sliding_window,
        ) {
            (Some(full), None) => full,
            _ => &self.kernels.attention,
        }
    }

    /// Queues segment `segment` of the forward pass, the launches between two attention
    /// launches: segment 0 embeds the tokens; segment `l` (from 1) finishes layer `l - 1` after
    /// its attention (output projection, norm, MLP); every segment below the layer count then
    /// starts layer `segment` up to its attention (norm, q/k/v product, rotary embedding, cache
    /// write). A segment reads only the token-indexed inputs, whose offsets depend on the
    /// step's token count alone, so it can be captured once per token count.
    pub(super) fn segment(
        &mut self,
        layout: &StepLayout,
        segment: usize,
    ) -> Result<(), BackendError> {
        let p = self.params.clone();
        let t = layout.num_tokens;
        let t32 = to_u32(t, "tokens")?;
        let qkv_n = (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim;
        let q_width = p.num_q_heads * p.head_dim;
        let layers = self.weights.layers.len();
        let (normed, delta) = (self.act.normed.device_ptr(), self.act.delta.device_ptr());
        // The down product's weight scales where its product was left unscaled for the next
        // layer's norm.
        let mut down_unscaled = None;

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
            let w_o_bias = w.o_bias.as_ref().map(DeviceBuffer::device_ptr);
            let (o_w, post_norm, dense) = (
                w.o_proj.operand(),
                w.post_norm.device_ptr(),
                w.dense()
                    .map(|(gate_up, down)| (gate_up.operand(), down.operand())),
            );
            let attn = self.act.attn.device_ptr();
            let o_dims = (t, p.hidden, q_width);
            // The norm after the o product applies cuBLASLt's scales itself where it quantizes
            // (the input of a dense FP8 MLP).
            let o_unscaled = match (o_w, dense.map(|(gate_up_w, _)| gate_up_w)) {
                (Operand::Fp8(o_w), Some(Operand::Fp8(next))) if next.norm_quantizes() => self
                    .fp8_product_deferring(attn, o_w, delta, o_dims, false, true)?
                    .then_some(o_w.scales),
                _ => {
                    self.project(attn, o_w, delta, o_dims)?;
                    None
                }
            };
            if let Some(bias) = w_o_bias {
                if o_unscaled.is_some() {
                    return Err(BackendError::Device(format!(
                        "layer {}'s output bias cannot follow a deferred FP8 product",
                        segment - 1
                    )));
                }
                self.add_output_bias(segment - 1, t32, bias)?;
            }
            match (self.definition.layers[segment - 1].mlp, dense) {
                (MlpDefinition::SwiGlu { intermediate }, Some((gate_up_w, down_w))) => {
                    self.norm_before(t32, Some(delta), post_norm, gate_up_w, o_unscaled)?;
                    let gate_up_dims = (t, 2 * intermediate, p.hidden);
                    // The gate/up weights' scales where their product was left unscaled.
                    let mut unscaled = None;
                    // Whether the product applied SwiGLU itself (a decode step's FP8 product).
                    let mut swiglu_applied = false;
                    match gate_up_w {
                        Operand::Bf16(gate_up_w) => {
                            let small_m = self.takes_small_m(normed, gate_up_w, gate_up_dims);
                            self.gate_up_swiglu(small_m, gate_up_w, t)?;
                        }
                        Operand::Fp8(gate_up_w)
                            if t <= plan::GEMV_MAX_M && plan::swiglu_fuses(intermediate) =>
                        {
                            let x = self.fp8_input(
                                normed,
                                gate_up_w,
                                (t, p.hidden),
                                gate_up_w.norm_quantizes(),
                            )?;
                            self.fp8_gate_up_swiglu(x, gate_up_w, t)?;
                            swiglu_applied = true;
                        }
                        Operand::Fp8(gate_up_w) => {
                            let gate_up = self.act.gate_up.device_ptr();
                            let quantized = gate_up_w.norm_quantizes();
                            // SwiGLU scales cuBLASLt's product itself where it also quantizes.
                            let defer = matches!(down_w, Operand::Fp8(d) if d.input.is_some());
                            let deferred = self.fp8_product_deferring(
                                normed,
                                gate_up_w,
                                gate_up,
                                gate_up_dims,
                                quantized,
                                defer,
                            )?;
                            unscaled = deferred.then_some(gate_up_w.scales);
                        }
                    }
                    let mlp = self.act.mlp.device_ptr();
                    let down_dims = (t, p.hidden, intermediate);
                    // The next layer's norm applies cuBLASLt's scales of the down product itself
                    // where it quantizes (the last layer's final norm does not).
                    let defer_down = segment < layers
                        && matches!(self.weights.layers[segment].qkv.operand(),
                            Operand::Fp8(next) if next.norm_quantizes());
                    match down_w {
                        // SwiGLU's output is in act.mlp: the down product (of at most
                        // GEMV_MAX_M rows, so never deferring its scales) quantizes it itself.
                        _ if swiglu_applied => self.project(mlp, down_w, delta, down_dims)?,
                        // An FP8 down product whose input is quantized: SwiGLU quantizes its
                        // output itself (one launch instead of SwiGLU and the quantization).
                        Operand::Fp8(down_w) if down_w.input.is_some() => {
                            let fused = matches!(gate_up_w, Operand::Fp8(_));
                            if fused {
                                self.fp8_swiglu_quantize(t, down_w, unscaled)?;
                            }
                            down_unscaled = self
                                .fp8_product_deferring(
                                    mlp, down_w, delta, down_dims, fused, defer_down,
                                )?
                                .then_some(down_w.scales);
                        }
                        _ => {
                            if matches!(gate_up_w, Operand::Fp8(_)) {
                                self.swiglu(t)?;
                            }
                            self.project(mlp, down_w, delta, down_dims)?;
                        }
                    }
                }
                (MlpDefinition::Moe(moe), None) => {
                    self.add_rmsnorm(t32, Some(delta), post_norm, None)?;
                    if matches!(moe.experts, ExpertKind::ClampedSwiGlu { .. }) {
                        self.gpt_oss_mlp(segment - 1, &moe, layout)?;
                    } else {
                        self.moe_mlp(segment - 1, &moe, layout)?;
                    }
                }
                _ => {
                    return Err(BackendError::Device(format!(
                        "layer {} has weights of another MLP than its definition's",
                        segment - 1
                    )));
                }
            }
        }
        if segment == layers {
            return Ok(());
        }
        let layer = segment;
        let w: &LayerWeights = &self.weights.layers[layer];
        let (input_norm, qkv_w) = (w.input_norm.device_ptr(), w.qkv.bf16());
        let qkv_operand = w.qkv.operand();
        // Layer 0 normalises the embeddings alone; later layers add the previous MLP's output.
        let previous = (layer > 0).then_some(delta);
        self.norm_before(t32, previous, input_norm, qkv_operand, down_unscaled)?;
        let small_m =
            qkv_w.is_some_and(|qkv_w| self.takes_small_m(normed, qkv_w, (t, qkv_n, p.hidden)));
        self.qkv_rope_write(small_m, layer, layout, t)
    }

    /// The gate/up product of `t` rows of `act.normed` with SwiGLU applied, into `act.mlp`: by
    /// the small-M kernels (`small_m`, which `plan::small_m_fits` and 16-byte alignment must
    /// allow; their SwiGLU entry where `plan::swiglu_fuses`) or by cuBLASLt, then the SwiGLU
    /// kernel unless the product applied it.
    pub(super) fn gate_up_swiglu(
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
        self.swiglu(t)
    }

    /// The FP8 gate/up product of `t` rows (at most `plan::GEMV_MAX_M`) of `x` (the product's
    /// input as `fp8_input` left it) with SwiGLU applied, into `act.mlp`
    /// (`fp8_gemv_swiglu_mM`).
    fn fp8_gate_up_swiglu(
        &self,
        x: DevicePtr<Bf16>,
        w: Fp8Operand,
        t: usize,
    ) -> Result<(), BackendError> {
        let (hidden, intermediate) = (self.params.hidden, self.params.intermediate);
        let (geometry, shape) = self.fp8_paired_shape(t, 2 * intermediate)?;
        self.launch(
            &self.kernels.fp8_gemv_swiglu[t - 1],
            shape,
            Fp8GemvSwiglu {
                x,
                w: w.values,
                scales: w.scales,
                out: self.act.mlp.device_ptr(),
                k: to_u32(hidden, "product depth")? as i32,
                groups: to_u32(w.groups, "scale groups")? as i32,
                group: to_u32(w.group, "scale group")? as i32,
                splits: to_u32(geometry.splits, "splits")? as i32,
            },
        )
    }

    /// The geometry and launch of a fused FP8 small-M entry (`fp8_gemv_swiglu_mM`,
    /// `fp8_gemv_qkv_rope_mM`, row groups of 4 rows: 2 pairs) for `m` rows of x over `n` weight
    /// rows: the plain product's measured geometry otherwise.
    fn fp8_paired_shape(
        &self,
        m: usize,
        n: usize,
    ) -> Result<(GemvGeometry, LaunchShape), BackendError> {
        let geometry = GemvGeometry {
            rows: 4,
            ..GemvGeometry::choose(m, n, self.params.hidden, self.sm_count)
        };
        let shape = LaunchShape::new(
            (to_u32(geometry.blocks(n), "product rows")?, 1, 1),
            geometry.threads(),
        );
        Ok((geometry, shape))
    }

    /// SwiGLU over the gate/up product of `t` rows in `act.gate_up`, quantized as the FP8 down
    /// product `down` quantizes its input, into the FP8 scratch buffers (`fp8_product` with
    /// `quantized` then reads them; `act.mlp` is not written). `unscaled`: the gate/up weights'
    /// scales, where the product is cuBLASLt's unscaled product of the codes (its per-token
    /// scales are still in the scratch buffer).
    fn fp8_swiglu_quantize(
        &self,
        t: usize,
        down: Fp8Operand,
        unscaled: Option<DevicePtr<f32>>,
    ) -> Result<(), BackendError> {
        let (Some(input), Some(scratch)) = (down.input, self.act.fp8.as_ref()) else {
            return Err(BackendError::Device(
                "an FP8 SwiGLU without its input scheme or buffers".into(),
            ));
        };
        let intermediate = self.params.intermediate;
        self.launch(
            &self.kernels.fp8_swiglu_quantize,
            LaunchShape::new(
                (
                    to_u32(t, "tokens")?,
                    to_u32(input.groups(intermediate), "input groups")?,
                    1,
                ),
                quant_threads(if input.group == 0 {
                    intermediate
                } else {
                    input.group
                }),
            ),
            Fp8SwigluQuantize {
                gate_up: self.act.gate_up.device_ptr(),
                x_scales: unscaled.map(|_| scratch.scales.device_ptr()),
                w_scales: unscaled,
                group: to_u32(input.group, "input group")? as i32,
                upper_bound: input.upper_bound,
                static_scale: input.static_scale,
                xq: scratch.codes.device_ptr(),
                xd: scratch.values.device_ptr(),
                scales: scratch.scales.device_ptr(),
            },
        )
    }

    /// SwiGLU over the gate/up product of `t` rows in `act.gate_up`, into `act.mlp`.
    fn swiglu(&self, t: usize) -> Result<(), BackendError> {
        let intermediate = self.params.intermediate;
        let (gate_up, mlp) = (self.act.gate_up.device_ptr(), self.act.mlp.device_ptr());
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
    pub(super) fn qkv_rope_write(
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
        let qkv_w = w.qkv.operand();
        let bias = w.qkv_bias.as_ref().map(DeviceBuffer::device_ptr);
        let (q_norm, k_norm) = (
            w.q_norm.as_ref().map(DeviceBuffer::device_ptr),
            w.k_norm.as_ref().map(DeviceBuffer::device_ptr),
        );
        let writes = RopeWrites {
            inv_freq: self.weights.inv_freq.device_ptr(),
            positions: self.input(layout.positions()),
            slots: self.input(layout.slots(self.kv.group(layer))),
            q_out: self.act.q.device_ptr(),
            k_cache: self.kv.keys(layer),
            v_cache: self.kv.values(layer),
            kv_scales: self.kv.scales(layer),
        };
        // A decode step's FP8 product does the rope write itself where the bf16 one may.
        if let Operand::Fp8(qkv_w) = qkv_w
            && t <= plan::GEMV_MAX_M
            && plan::rope_write_fuses(head_dim, p.qk_norm)
        {
            let x = self.fp8_input(normed, qkv_w, (t, hidden), qkv_w.norm_quantizes())?;
            let (geometry, shape) = self.fp8_paired_shape(t, heads * head_dim)?;
            return self.launch(
                &self.kernels.fp8_gemv_qkv_rope[t - 1],
                shape,
                Fp8GemvQkvRope {
                    x,
                    w: qkv_w.values,
                    scales: qkv_w.scales,
                    bias,
                    writes,
                    k: to_u32(hidden, "product depth")? as i32,
                    groups: to_u32(qkv_w.groups, "scale groups")? as i32,
                    group: to_u32(qkv_w.group, "scale group")? as i32,
                    splits: to_u32(geometry.splits, "splits")? as i32,
                },
            );
        }
        if let (true, Operand::Bf16(qkv_w)) = (fused, qkv_w) {
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
        let dims = (t, heads * head_dim, hidden);
        let shape = LaunchShape::new((to_u32(t, "tokens")?, 1, 1), 32 * heads.min(32) as u32);
        match qkv_w {
            Operand::Bf16(qkv_w) => self.product(small_m, (normed, qkv_w, qkv), dims)?,
            Operand::Fp8(qkv_w) => {
                let quantized = qkv_w.norm_quantizes();
                // cuBLASLt's FP8 product is left unscaled: the rope write applies its scales
                // (no fp8_scale_output pass over the q/k/v product).
                if self.fp8_product_deferring(normed, qkv_w, qkv, dims, quantized, true)? {
                    let x_scales = self
                        .act
                        .fp8
                        .as_ref()
                        .map(|scratch| scratch.scales.device_ptr())
                        .ok_or_else(|| {
                            BackendError::Device("an FP8 product without its buffers".into())
                        })?;
                    return self.launch(
                        &self.kernels.qkv_rope_scaled,
                        shape,
                        QkvRopeWriteScaled {
                            qkv,
                            x_scales,
                            w_scales: qkv_w.scales,
                            bias,
                            q_norm,
                            k_norm,
                            writes,
                        },
                    );
                }
            }
        }
        self.launch(
            &self.kernels.qkv_rope,
            shape,
            QkvRopeWrite {
                qkv,
                bias,
                q_norm,
                k_norm,
                writes,
            },
        )
    }

    /// [`Self::add_rmsnorm`] of the first `rows` rows before the product with `next`: for an FP8
    /// projection whose input is quantized per token (`Fp8Operand::norm_quantizes`), the fused
    /// kernel that also leaves the quantized input in the FP8 scratch buffers, which the product
    /// then reads (`fp8_product` with `quantized`). `unscaled`: the weight scales of the FP8
    /// product that wrote `delta`, where it is cuBLASLt's unscaled product of the codes (its
    /// per-token scales still in the FP8 scratch buffer; only with such a `next`).
    fn norm_before(
        &self,
        rows: u32,
        delta: Option<DevicePtr<f32>>,
        weight: DevicePtr<Bf16>,
        next: Operand,
        unscaled: Option<DevicePtr<f32>>,
    ) -> Result<(), BackendError> {
        let (Operand::Fp8(w), Some(scratch)) = (next, self.act.fp8.as_ref()) else {
            return self.add_rmsnorm(rows, delta, weight, None);
        };
        let Some(input) = w.input.filter(|_| w.norm_quantizes()) else {
            return self.add_rmsnorm(rows, delta, weight, None);
        };
        self.launch(
            &self.kernels.fp8_add_rmsnorm,
            LaunchShape::new((rows, 1, 1), plan::RMS_THREADS as u32),
            Fp8AddRmsnorm {
                residual: self.act.residual.device_ptr(),
                delta,
                x_scales: unscaled.map(|_| scratch.scales.device_ptr()),
                w_scales: unscaled,
                weight,
                out: self.act.normed.device_ptr(),
                upper_bound: input.upper_bound,
                static_scale: input.static_scale,
                xq: scratch.codes.device_ptr(),
                xd: scratch.values.device_ptr(),
                scales: scratch.scales.device_ptr(),
            },
        )
    }

    /// Adds `delta` (if any) to the residual stream and writes its RMS norm with `weight` into
    /// `act.normed`, for `rows` rows: the first ones, or those listed at `row_index` (if given).
    pub(super) fn add_rmsnorm(
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
    pub(super) fn logits(&mut self, layout: &StepLayout) -> Result<(), BackendError> {
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

    /// Attention of one layer into `act.attn`: the tiled prefill kernel when the step carries
    /// prefill tiles, else the paged split-K kernel and, when a token may take more than one
    /// partition, its reduction.
    pub(super) fn attention(
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
                plan::tile_key_span(
                    layout.max_context,
                    self.definition.layers[layer].attention.sliding_window,
                    p.flash.rows,
                ),
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
                    &self.attention_kernels(layer).prefill,
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
                    &self.attention_kernels(layer).prefill_small,
                    LaunchShape::new(
                        (to_u32(layout.num_small_tiles, "tiles")?, kv_heads, z),
                        to_u32(plan::SMALL_FLASH.threads(), "threads")?,
                    ),
                    args(big),
                )?;
            }
            return if splits > 1 {
                self.reduce_attention(layer, layout, splits, true)
            } else {
                Ok(())
            };
        }
        self.launch(
            &self.attention_kernels(layer).paged,
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
            self.reduce_attention(layer, layout, splits, false)
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
            kv_scales: self.kv.scales(layer),
            sinks: self.layer_sinks(layer),
            block_tables: self.input(layout.block_tables()),
            max_blocks_word: self.input(layout.max_blocks_word()),
            token_row: self.input(layout.token_rows(self.kv.group(layer))),
            positions: self.input(layout.positions()),
        }
    }

    /// The attention sinks of `layer`, if its attention has any.
    fn layer_sinks(&self, layer: usize) -> Option<DevicePtr<f32>> {
        self.weights.layers[layer]
            .sinks
            .as_ref()
            .map(DeviceBuffer::device_ptr)
    }

    /// Merges the split partial results of one attention launch into `act.attn`: each token's
    /// own count of splits (the paged kernel's), or all `splits` (the prefill kernel's).
    fn reduce_attention(
        &self,
        layer: usize,
        layout: &StepLayout,
        splits: usize,
        all_splits: bool,
    ) -> Result<(), BackendError> {
        self.launch(
            &self.attention_kernels(layer).reduce,
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
                sinks: self.layer_sinks(layer),
                splits: splits as i32,
                all_splits: i32::from(all_splits),
                out: self.act.attn.device_ptr(),
            },
        )
    }
}
