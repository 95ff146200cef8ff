//! gpt-oss's layer pieces beyond the other architectures' as kernel launches
//! (`kernels/gpt_oss.cu`): the output projection's bias, and the experts: the router's product,
//! the biased top-k-then-softmax routing, each slot's biased gate/up product through the clamped
//! SwiGLU, its biased down product (each over bf16 experts or MXFP4 ones, widened in registers),
//! and the weighted sum into `act.delta`. Every size beyond the
//! step's token count is fixed, so the launches can be captured in a CUDA graph.

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use crate::engine::BackendError;
use crate::model::MoeDefinition;

use crate::backend::cuda::compile::KernelError;
use crate::backend::cuda::gpt_oss::ExpertMatrix;
use crate::backend::cuda::inputs::StepLayout;
use crate::backend::cuda::launch::{
    Bf16, DevicePtr, E2m1x2, E8m0, GptOssAddBias, GptOssCombine, GptOssDown, GptOssDownMxfp4,
    GptOssGateUp, GptOssGateUpMxfp4, GptOssRoute, Kernel, LaunchShape,
};
use crate::backend::cuda::memory::DeviceBuffer;

use super::{CudaBackend, to_u32};

/// Warps per block of the routing and the expert products (`GO_WARPS` in `kernels/gpt_oss.cu`):
/// a token each in the routing, an output row (pair) each in the products.
const WARPS: usize = 4;

/// Threads per block of the element-wise kernels (combine, bias).
const THREADS: u32 = 256;

/// Where an expert matrix is on the device, as its product's kernel takes it.
#[derive(Clone, Copy)]
enum Matrix {
    /// bf16 values.
    Bf16(DevicePtr<Bf16>),
    /// MXFP4 blocks and scales.
    Mxfp4(DevicePtr<E2m1x2>, DevicePtr<E8m0>),
}

impl Matrix {
    fn of(matrix: &ExpertMatrix) -> Self {
        match matrix {
            ExpertMatrix::Bf16(values) => Self::Bf16(values.device_ptr()),
            ExpertMatrix::Mxfp4 { blocks, scales } => {
                Self::Mxfp4(blocks.device_ptr(), scales.device_ptr())
            }
        }
    }
}

/// The entry points of `kernels/gpt_oss.cu`.
pub(super) struct GptOssKernels {
    route: Kernel<GptOssRoute>,
    gate_up: Kernel<GptOssGateUp>,
    gate_up_mxfp4: Kernel<GptOssGateUpMxfp4>,
    down: Kernel<GptOssDown>,
    down_mxfp4: Kernel<GptOssDownMxfp4>,
    combine: Kernel<GptOssCombine>,
    add_bias: Kernel<GptOssAddBias>,
}

impl GptOssKernels {
    /// The kernels out of the loaded `map`, or `None` when the family was not compiled (a model
    /// without gpt-oss's experts).
    pub(super) fn take(
        map: &mut HashMap<&'static str, CudaFunction>,
    ) -> Result<Option<Self>, KernelError> {
        if !map.contains_key("gptoss_route") {
            return Ok(None);
        }
        Ok(Some(Self {
            route: Kernel::take(map, "gptoss_route")?,
            gate_up: Kernel::take(map, "gptoss_gate_up")?,
            gate_up_mxfp4: Kernel::take(map, "gptoss_gate_up_mxfp4")?,
            down: Kernel::take(map, "gptoss_down")?,
            down_mxfp4: Kernel::take(map, "gptoss_down_mxfp4")?,
            combine: Kernel::take(map, "gptoss_combine")?,
            add_bias: Kernel::take(map, "gptoss_add_bias")?,
        }))
    }
}

impl CudaBackend {
    /// gpt-oss's kernels, or an error naming `layer` when they were not compiled.
    fn gpt_oss_kernels(&self, layer: usize) -> Result<&GptOssKernels, BackendError> {
        self.kernels
            .gpt_oss
            .as_ref()
            .ok_or_else(|| BackendError::Device(format!("layer {layer} needs gpt-oss's kernels")))
    }

    /// Adds layer `layer`'s output-projection bias to the `tokens` rows of `act.delta`.
    pub(super) fn add_output_bias(
        &self,
        layer: usize,
        tokens: u32,
        bias: DevicePtr<Bf16>,
    ) -> Result<(), BackendError> {
        self.launch(
            &self.gpt_oss_kernels(layer)?.add_bias,
            LaunchShape::new((tokens, 1, 1), THREADS),
            GptOssAddBias {
                delta: self.act.delta.device_ptr(),
                bias,
            },
        )
    }

    /// Layer `layer`'s gpt-oss experts over the step's `act.normed` rows, into `act.delta`.
    pub(super) fn gpt_oss_mlp(
        &mut self,
        layer: usize,
        moe: &MoeDefinition,
        layout: &StepLayout,
    ) -> Result<(), BackendError> {
        let missing = |what: &str| BackendError::Device(format!("layer {layer} has no {what}"));
        let t = layout.num_tokens;
        let hidden = self.params.hidden;
        let slots = to_u32(t * moe.routing.top_k(), "expert slots")?;
        let w = self.weights.layers[layer]
            .gpt_oss()
            .ok_or_else(|| missing("gpt-oss experts"))?;
        let ptr = |b: &DeviceBuffer| b.device_ptr::<Bf16>();
        let (router, router_bias) = (ptr(&w.router), ptr(&w.router_bias));
        let (gate_up_bias, down_bias) = (ptr(&w.gate_up_bias), ptr(&w.down_bias));
        let (gate_up, down) = (Matrix::of(&w.gate_up), Matrix::of(&w.down));
        let s = self
            .act
            .moe
            .as_ref()
            .ok_or_else(|| missing("expert buffers"))?;
        let (logits, topk_ids, topk_weights, act, y) = (
            s.logits.device_ptr(),
            s.topk_ids.device_ptr(),
            s.topk_weights.device_ptr(),
            s.h_perm.device_ptr(),
            s.y_perm.device_ptr(),
        );
        let normed = self.act.normed.device_ptr();
        self.matmul(normed, router, logits, (t, moe.num_experts, hidden))?;
        let kernels = self.gpt_oss_kernels(layer)?;
        let block = (WARPS * 32) as u32;
        self.launch(
            &kernels.route,
            LaunchShape::new((to_u32(t.div_ceil(WARPS), "tokens")?, 1, 1), block),
            GptOssRoute {
                logits,
                bias: router_bias,
                topk_ids,
                topk_weights,
                count: to_u32(t, "tokens")? as i32,
            },
        )?;
        let rows = |n: usize| to_u32(n.div_ceil(WARPS), "product rows");
        let shape = LaunchShape::new((slots, rows(moe.expert_intermediate)?, 1), block);
        match gate_up {
            Matrix::Bf16(m) => self.launch(
                &kernels.gate_up,
                shape,
                GptOssGateUp {
                    x: normed,
                    w: m,
                    bias: gate_up_bias,
                    topk_ids,
                    act,
                },
            )?,
            Matrix::Mxfp4(blocks, scales) => self.launch(
                &kernels.gate_up_mxfp4,
                shape,
                GptOssGateUpMxfp4 {
                    x: normed,
                    blocks,
                    scales,
                    bias: gate_up_bias,
                    topk_ids,
                    act,
                },
            )?,
        }
        let shape = LaunchShape::new((slots, rows(hidden)?, 1), block);
        match down {
            Matrix::Bf16(m) => self.launch(
                &kernels.down,
                shape,
                GptOssDown {
                    act,
                    w: m,
                    bias: down_bias,
                    topk_ids,
                    y,
                },
            )?,
            Matrix::Mxfp4(blocks, scales) => self.launch(
                &kernels.down_mxfp4,
                shape,
                GptOssDownMxfp4 {
                    act,
                    blocks,
                    scales,
                    bias: down_bias,
                    topk_ids,
                    y,
                },
            )?,
        }
        self.launch(
            &kernels.combine,
            LaunchShape::new((to_u32(t, "tokens")?, 1, 1), THREADS),
            GptOssCombine {
                y,
                topk_ids,
                topk_weights,
                delta: self.act.delta.device_ptr(),
            },
        )
    }
}
