//! A mixture of experts on the device: each sparse layer's weights (the router, every expert's
//! projections fused into one buffer per projection, in bf16 or in FP8 with their scales, the
//! optional shared expert) and the step buffers of the routing, the permutation and the grouped
//! products (`kernels/moe.cu`, `kernels/moe_fp8.cu`).

use crate::engine::BackendError;
use crate::model::{FusedExperts, ModelConfig, ModelWeights, MoeTensors, TensorSpec};

use super::error::CudaInitError;
use super::fp8::{DeviceScales, InputQuantization};
use super::launch::{DevicePtr, E4m3};
use super::memory::DeviceBuffer;
use super::weights::{Allocator, HostFp8, f32_bytes, host_fp8};

/// One sparse layer's weights.
pub struct MoeLayerWeights {
    /// The router, `[experts, hidden]` bf16, with the shared expert's gate (`[1, hidden]`) stacked
    /// under it when there is one: one product gives every router logit and the gate's.
    pub router: DeviceBuffer,
    /// Every expert's projections.
    pub experts: ExpertWeights,
    /// The shared expert (Qwen2-MoE), if any.
    pub shared: Option<SharedExpertWeights>,
}

/// Every expert's projections, fused into one buffer per projection.
pub enum ExpertWeights {
    /// bf16 experts (`kernels/moe.cu`).
    Bf16 {
        /// Every expert's gate and up projections, `[experts, 2 · intermediate, hidden]`: expert
        /// `e`'s gate rows, then its up rows (the dense `gate_up` layout, per expert).
        gate_up: DeviceBuffer,
        /// Every expert's down projection, `[experts, hidden, intermediate]`.
        down: DeviceBuffer,
    },
    /// FP8 experts (`kernels/moe_fp8.cu`; not yet run on a GPU).
    Fp8 {
        /// Every expert's gate and up projections, rows in groups of 4 (gate `2i`, `2i + 1`,
        /// then up `2i`, `2i + 1`).
        gate_up: Fp8Experts,
        /// Every expert's down projection.
        down: Fp8Experts,
    },
}

/// One projection of every expert in FP8: E4M3 bytes and f32 scales in `fp8.rs`'s device layout,
/// expert after expert.
pub struct Fp8Experts {
    /// `[experts, out, in]` E4M3 bytes.
    pub values: DeviceBuffer,
    /// `[experts, out, groups]` f32 scales.
    pub scales: DeviceBuffer,
    /// Scales per row.
    pub groups: usize,
    /// Input columns per scale.
    pub group: usize,
    /// How the products' input is rounded; `None`: it stays bf16 (weight-only FP8).
    pub input: Option<InputQuantization>,
    /// Each expert's static input scale, `[experts]` f32, for a static scheme (of stacked gate
    /// and up, the larger, as for the dense projections).
    pub static_scales: Option<DeviceBuffer>,
}

/// What the FP8 expert products need of an [`Fp8Experts`]: addresses and layout.
#[derive(Debug, Clone, Copy)]
pub struct Fp8ExpertOperand {
    /// `[experts, out, in]` E4M3 bytes.
    pub values: DevicePtr<E4m3>,
    /// `[experts, out, groups]` f32 scales.
    pub scales: DevicePtr<f32>,
    /// Scales per row.
    pub groups: usize,
    /// Input columns per scale.
    pub group: usize,
    /// How the input is rounded; `None`: not at all.
    pub input: Option<InputQuantization>,
    /// Each expert's static input scale, for a static scheme.
    pub static_scales: Option<DevicePtr<f32>>,
}

impl Fp8Experts {
    /// What the products need of it.
    pub fn operand(&self) -> Fp8ExpertOperand {
        Fp8ExpertOperand {
            values: self.values.device_ptr(),
            scales: self.scales.device_ptr(),
            groups: self.groups,
            group: self.group,
            input: self.input,
            static_scales: self.static_scales.as_ref().map(|b| b.device_ptr()),
        }
    }
}

/// The shared expert's projections, bf16.
pub struct SharedExpertWeights {
    /// Gate and up stacked, `[2 · width, hidden]`.
    pub gate_up: DeviceBuffer,
    /// Down, `[hidden, width]`.
    pub down: DeviceBuffer,
}

impl MoeLayerWeights {
    /// Allocates the layer's buffers with `up` and records where each per-expert tensor of the
    /// checkpoint goes in them (the upload copies each straight to its place: nothing is copied
    /// twice). FP8 experts are built from `weights` and copied now, as the dense FP8 projections
    /// are; a shared expert beside FP8 experts is refused.
    pub(super) fn allocate(
        up: &mut Allocator,
        t: &MoeTensors,
        weights: Option<&ModelWeights>,
    ) -> Result<Self, CudaInitError> {
        let fp8 = t
            .projections()
            .iter()
            .flat_map(|fused| &fused.experts)
            .any(|expert| expert.fp8.is_some());
        let mut router: Vec<&TensorSpec> = vec![&t.router.weight];
        if let Some((_, gate)) = &t.shared_expert {
            router.push(&gate.weight);
        }
        let experts = if fp8 {
            if t.shared_expert.is_some() {
                return Err(CudaInitError::Unsupported(
                    "its experts are FP8 beside a shared expert, which the CUDA backend's FP8 experts do not serve (the CPU backend does: --device cpu)".into(),
                ));
            }
            let Some(weights) = weights else {
                return Err(CudaInitError::Unsupported(
                    "FP8 experts are built from the weights, not ahead of them".into(),
                ));
            };
            let gate_up = fp8_experts(up, &[&t.gate_proj, &t.up_proj], weights)?;
            let down = fp8_experts(up, &[&t.down_proj], weights)?;
            ExpertWeights::Fp8 { gate_up, down }
        } else {
            let gate_up: Vec<&TensorSpec> = t
                .gate_proj
                .experts
                .iter()
                .zip(&t.up_proj.experts)
                .flat_map(|(gate, up)| [&gate.weight, &up.weight])
                .collect();
            let down: Vec<&TensorSpec> = t.down_proj.experts.iter().map(|d| &d.weight).collect();
            ExpertWeights::Bf16 {
                gate_up: up.stacked(&gate_up)?,
                down: up.stacked(&down)?,
            }
        };
        let shared = match &t.shared_expert {
            Some((mlp, _)) => Some(SharedExpertWeights {
                gate_up: up.stacked(&[&mlp.gate_proj.weight, &mlp.up_proj.weight])?,
                down: up.stacked(&[&mlp.down_proj.weight])?,
            }),
            None => None,
        };
        Ok(Self {
            router: up.stacked(&router)?,
            experts,
            shared,
        })
    }
}

/// The rows of a gate/up pair `gate` and `up` (each `rows` rows of `width` items) in groups of
/// 4: gate `2i`, `2i + 1`, then up `2i`, `2i + 1` (`rows` is even).
fn pair_rows<T: Copy>(gate: &[T], up: &[T], rows: usize, width: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(2 * rows * width);
    for pair in 0..rows / 2 {
        let span = 2 * pair * width..(2 * pair + 2) * width;
        out.extend_from_slice(&gate[span.clone()]);
        out.extend_from_slice(&up[span]);
    }
    out
}

/// Every expert's FP8 projection of `fused` (one, or gate and up, whose rows are then paired as
/// [`pair_rows`] says) on the device, expert after expert.
fn fp8_experts(
    up: &mut Allocator,
    fused: &[&FusedExperts],
    weights: &ModelWeights,
) -> Result<Fp8Experts, CudaInitError> {
    let experts = fused[0].experts.len();
    let mut values = Vec::new();
    let mut scales: Vec<DeviceScales> = Vec::with_capacity(experts);
    let mut static_scales = Vec::with_capacity(experts);
    let mut scheme = None;
    for e in 0..experts {
        let parts = fused
            .iter()
            .map(|f| host_fp8(&f.experts[e], weights))
            .collect::<Result<Vec<HostFp8<'_>>, _>>()?;
        let input_scale = parts.iter().filter_map(|p| p.input_scale).reduce(f32::max);
        static_scales.push(input_scale.unwrap_or(1.0));
        scheme = parts.first().map(|p| p.activations);
        match parts.as_slice() {
            [one] => {
                values.extend_from_slice(&one.values);
                scales.push(one.scales.clone());
            }
            [gate, up_part] => {
                let rows = fused[0].experts[e].weight.shape[0];
                let inp = fused[0].experts[e].weight.shape[1];
                if gate.scales.groups != up_part.scales.groups
                    || gate.scales.group != up_part.scales.group
                {
                    return Err(CudaInitError::Unsupported(
                        "FP8 gate and up projections with different scale layouts".into(),
                    ));
                }
                let groups = gate.scales.groups;
                values.extend(pair_rows(&gate.values[..], &up_part.values[..], rows, inp));
                scales.push(DeviceScales {
                    scales: pair_rows(&gate.scales.scales, &up_part.scales.scales, rows, groups),
                    groups,
                    group: gate.scales.group,
                });
            }
            _ => {
                return Err(CudaInitError::Weights(
                    "FP8 experts are one projection or a gate/up pair".into(),
                ));
            }
        }
    }
    let stacked = DeviceScales::stack(&scales).ok_or_else(|| {
        CudaInitError::Unsupported("FP8 experts with different scale layouts".into())
    })?;
    let input = scheme.and_then(|s| InputQuantization::of(s, None));
    let static_scales = match input {
        Some(i) if i.static_scale > 0.0 => {
            Some(DeviceBuffer::from_bytes(&f32_bytes(&static_scales))?)
        }
        _ => None,
    };
    let scale_bytes = f32_bytes(&stacked.scales);
    up.add_bytes(values.len() + scale_bytes.len() + 4 * experts);
    Ok(Fp8Experts {
        values: DeviceBuffer::from_bytes(&values)?,
        scales: DeviceBuffer::from_bytes(&scale_bytes)?,
        groups: stacked.groups,
        group: stacked.group,
        input,
        static_scales,
    })
}

/// The shared expert's step buffers.
pub struct SharedScratch {
    /// Its gate/up product, `[tokens, 2 · width]` fp32.
    pub gate_up: DeviceBuffer,
    /// SwiGLU of it, `[tokens, width]` bf16.
    pub mlp: DeviceBuffer,
    /// Its output, `[tokens, hidden]` fp32.
    pub out: DeviceBuffer,
}

/// Words of the permutation's `meta` buffer for `experts` experts (`MOE_META_WORDS`).
fn meta_words(experts: usize) -> usize {
    3 * experts + 3
}

/// The step buffers of a mixture of experts, sized for `max_tokens` tokens.
pub struct MoeScratch {
    /// Router logits (and the shared expert's gate), `[tokens, logits]` fp32.
    pub logits: DeviceBuffer,
    /// Each token's experts, `[tokens, top_k]`.
    pub topk_ids: DeviceBuffer,
    /// Their weights, `[tokens, top_k]` fp32.
    pub topk_weights: DeviceBuffer,
    /// Segment offsets `[experts + 1]`, the count of experts with rows, their list `[experts]`,
    /// each expert's first row tile of the grouped GEMM `[experts + 1]` (`MOE_META_*` in
    /// `kernels/moe.cu`).
    pub meta: DeviceBuffer,
    /// Each permuted row's token, `[tokens · top_k]`.
    pub sorted_tokens: DeviceBuffer,
    /// Each (token, slot)'s permuted row, `[tokens · top_k]`.
    pub row_of: DeviceBuffer,
    /// The permuted rows of the normalised input, `[tokens · top_k, hidden]` bf16.
    pub x_perm: DeviceBuffer,
    /// The experts' SwiGLU outputs, `[tokens · top_k, intermediate]` bf16.
    pub h_perm: DeviceBuffer,
    /// The experts' outputs, `[tokens · top_k, hidden]` fp32.
    pub y_perm: DeviceBuffer,
    /// The shared expert's buffers, if the model has one.
    pub shared: Option<SharedScratch>,
}

impl MoeScratch {
    /// The buffers of a model with configuration `cfg` for steps of up to `max_tokens` tokens,
    /// or `None` for a dense model.
    pub fn new(cfg: &ModelConfig, max_tokens: usize) -> Result<Option<Self>, BackendError> {
        let Some(moe) = &cfg.moe else {
            return Ok(None);
        };
        let h = cfg.hidden_size;
        let rows = max_tokens * moe.top_k;
        let shared_width = moe.shared_expert_intermediate;
        let logits = moe.num_experts + usize::from(shared_width.is_some());
        let shared = match shared_width {
            Some(width) => Some(SharedScratch {
                gate_up: DeviceBuffer::new(max_tokens * 2 * width * 4)?,
                mlp: DeviceBuffer::new(max_tokens * width * 2)?,
                out: DeviceBuffer::new(max_tokens * h * 4)?,
            }),
            None => None,
        };
        Ok(Some(Self {
            logits: DeviceBuffer::new(max_tokens * logits * 4)?,
            topk_ids: DeviceBuffer::new(rows * 4)?,
            topk_weights: DeviceBuffer::new(rows * 4)?,
            meta: DeviceBuffer::new(meta_words(moe.num_experts) * 4)?,
            sorted_tokens: DeviceBuffer::new(rows * 4)?,
            row_of: DeviceBuffer::new(rows * 4)?,
            x_perm: DeviceBuffer::new(rows * h * 2)?,
            h_perm: DeviceBuffer::new(rows * moe.expert_intermediate * 2)?,
            y_perm: DeviceBuffer::new(rows * h * 4)?,
            shared,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::pair_rows;

    #[test]
    fn gate_and_up_rows_pair_in_groups_of_four() {
        // Four gate rows g0..g3 and four up rows u0..u3, two items each.
        let gate: Vec<u32> = (0..8).collect();
        let up: Vec<u32> = (100..108).collect();
        let paired = pair_rows(&gate, &up, 4, 2);
        // g0 g1 u0 u1 g2 g3 u2 u3: a row group of 4 holds two whole SwiGLU pairs.
        assert_eq!(
            paired,
            vec![
                0, 1, 2, 3, 100, 101, 102, 103, 4, 5, 6, 7, 104, 105, 106, 107
            ]
        );
    }
}
