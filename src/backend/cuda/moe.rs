//! A mixture of experts on the device: each sparse layer's weights (the router, every expert's
//! projections fused into one buffer per projection, the optional shared expert) and the step
//! buffers of the routing, the permutation and the grouped products (`kernels/moe.cu`).

use crate::engine::BackendError;
use crate::model::{ModelConfig, MoeTensors, TensorSpec};

use super::error::CudaInitError;
use super::memory::DeviceBuffer;
use super::weights::Allocator;

/// One sparse layer's weights, bf16.
pub struct MoeLayerWeights {
    /// The router, `[experts, hidden]`, with the shared expert's gate (`[1, hidden]`) stacked
    /// under it when there is one: one product gives every router logit and the gate's.
    pub router: DeviceBuffer,
    /// Every expert's gate and up projections, `[experts, 2 · intermediate, hidden]`: expert
    /// `e`'s gate rows, then its up rows (the dense `gate_up` layout, per expert).
    pub gate_up: DeviceBuffer,
    /// Every expert's down projection, `[experts, hidden, intermediate]`.
    pub down: DeviceBuffer,
    /// The shared expert (Qwen2-MoE), if any.
    pub shared: Option<SharedExpertWeights>,
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
    /// twice). FP8 experts are refused here: the grouped products are bf16.
    pub(super) fn allocate(up: &mut Allocator, t: &MoeTensors) -> Result<Self, CudaInitError> {
        let fp8 = t
            .projections()
            .iter()
            .flat_map(|fused| &fused.experts)
            .any(|expert| expert.fp8.is_some());
        if fp8 {
            return Err(CudaInitError::Unsupported(
                "its experts are FP8, and the CUDA backend's grouped expert products are bf16 only (the CPU backend serves it: --device cpu)".into(),
            ));
        }
        let mut router: Vec<&TensorSpec> = vec![&t.router.weight];
        if let Some((_, gate)) = &t.shared_expert {
            router.push(&gate.weight);
        }
        let gate_up: Vec<&TensorSpec> = t
            .gate_proj
            .experts
            .iter()
            .zip(&t.up_proj.experts)
            .flat_map(|(gate, up)| [&gate.weight, &up.weight])
            .collect();
        let down: Vec<&TensorSpec> = t.down_proj.experts.iter().map(|d| &d.weight).collect();
        let shared = match &t.shared_expert {
            Some((mlp, _)) => Some(SharedExpertWeights {
                gate_up: up.stacked(&[&mlp.gate_proj.weight, &mlp.up_proj.weight])?,
                down: up.stacked(&[&mlp.down_proj.weight])?,
            }),
            None => None,
        };
        Ok(Self {
            router: up.stacked(&router)?,
            gate_up: up.stacked(&gate_up)?,
            down: up.stacked(&down)?,
            shared,
        })
    }
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
