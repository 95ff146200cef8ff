//! gpt-oss's layer pieces beyond the other architectures' as kernel launches
//! (`kernels/gpt_oss.cu`): the output projection's bias, and the experts: the router's product,
//! the biased top-k-then-softmax routing, each slot's biased gate/up product through the clamped
//! SwiGLU, its biased down product (each over bf16 experts or MXFP4 ones, widened in registers),
//! and the weighted sum into `act.delta`; for many rows per expert (prefill) the slots grouped by
//! expert and the products on tensor-core tiles instead (`gpt_oss_grouped`, not yet run on a
//! GPU). Every size beyond the step's token count is fixed, so the launches can be captured in a
//! CUDA graph.

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use crate::engine::BackendError;
use crate::model::MoeDefinition;

use crate::backend::cuda::compile::KernelError;
use crate::backend::cuda::gpt_oss::ExpertMatrix;
use crate::backend::cuda::inputs::StepLayout;
use crate::backend::cuda::launch::{
    Bf16, DevicePtr, E2m1x2, E8m0, GptOssAddBias, GptOssCombine, GptOssDown, GptOssDownMxfp4,
    GptOssGateUp, GptOssGateUpMxfp4, GptOssGather, GptOssGemmDown, GptOssGemmDownMxfp4,
    GptOssGemmGateUp, GptOssGemmGateUpMxfp4, GptOssPermute, GptOssRoute, Kernel, LaunchShape,
};
use crate::backend::cuda::memory::DeviceBuffer;

use super::moe::tile_shape;
use super::{CudaBackend, to_u32};

/// Threads of the permutation's one block (`gptoss_permute`).
const PERMUTE_THREADS: u32 = 1024;

/// Most blocks of the gather (each copies whole rows, in turn).
const GATHER_BLOCKS: usize = 4096;

/// Output columns per block of the tile products: gate/up 32 (of 64 interleaved weight rows),
/// down 64 (`MOE_BN`).
const TILE_SWIGLU_COLUMNS: usize = 32;
const TILE_COLUMNS: usize = 64;

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
    permute: Kernel<GptOssPermute>,
    gather: Kernel<GptOssGather>,
    gemm_gate_up: Kernel<GptOssGemmGateUp>,
    gemm_gate_up_mxfp4: Kernel<GptOssGemmGateUpMxfp4>,
    gemm_down: Kernel<GptOssGemmDown>,
    gemm_down_mxfp4: Kernel<GptOssGemmDownMxfp4>,
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
            permute: Kernel::take(map, "gptoss_permute")?,
            gather: Kernel::take(map, "gptoss_gather")?,
            gemm_gate_up: Kernel::take(map, "gptoss_gemm_gate_up")?,
            gemm_gate_up_mxfp4: Kernel::take(map, "gptoss_gemm_gate_up_mxfp4")?,
            gemm_down: Kernel::take(map, "gptoss_gemm_down")?,
            gemm_down_mxfp4: Kernel::take(map, "gptoss_gemm_down_mxfp4")?,
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

    /// Whether a step of `rows` expert slots among `experts` experts takes the grouped tile path.
    /// The per-slot products read the whole expert for every slot, so they pay only where the
    /// slots rarely share an expert; the tiles read each chosen expert once however many rows it
    /// has (padding its tile with idle rows). At `rows` = `experts`, about 63% of the experts are
    /// chosen, so the per-slot path would read 1.6 times the weights: from there the tiles take
    /// it (gpt-oss-120b: batch 32 and up; at batch 64 the per-slot path read every slot's expert,
    /// 2.3 times the chosen experts' bytes, and took 154 ms a step on an H100).
    fn gpt_oss_takes_tiles(&self, rows: usize, experts: usize) -> bool {
        self.params.gemv_tensor_cores && rows >= experts
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
        let buffers = Grouped {
            meta: s.meta.device_ptr(),
            sorted_tokens: s.sorted_tokens.device_ptr(),
            row_of: s.row_of.device_ptr(),
            x_perm: s.x_perm.device_ptr(),
        };
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
        if self.gpt_oss_takes_tiles(t * moe.routing.top_k(), moe.num_experts) {
            let biases = (gate_up_bias, down_bias);
            return self.gpt_oss_grouped(layer, moe, t, (gate_up, down), biases, buffers);
        }
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
                row_of: None,
                topk_ids,
                topk_weights,
                delta: self.act.delta.device_ptr(),
            },
        )
    }

    /// Layer `layer`'s gpt-oss experts for a step of `t` tokens with many rows per expert
    /// (prefill), after the routing: the slots grouped by expert (`gptoss_permute`), the
    /// permuted rows gathered, the biased gate/up product through the clamped SwiGLU and the
    /// biased down product on tensor-core tiles (MXFP4 widened to bf16 as each tile is loaded),
    /// and the weighted sum read through the permutation, into `act.delta`. Not yet run on a GPU.
    fn gpt_oss_grouped(
        &self,
        layer: usize,
        moe: &MoeDefinition,
        t: usize,
        (gate_up, down): (Matrix, Matrix),
        (gate_up_bias, down_bias): (DevicePtr<Bf16>, DevicePtr<Bf16>),
        b: Grouped,
    ) -> Result<(), BackendError> {
        let missing = |what: &str| BackendError::Device(format!("layer {layer} has no {what}"));
        let s = self
            .act
            .moe
            .as_ref()
            .ok_or_else(|| missing("expert buffers"))?;
        let (topk_ids, topk_weights, act, y) = (
            s.topk_ids.device_ptr(),
            s.topk_weights.device_ptr(),
            s.h_perm.device_ptr(),
            s.y_perm.device_ptr(),
        );
        let kernels = self.gpt_oss_kernels(layer)?;
        let count = to_u32(t, "tokens")? as i32;
        let rows = t * moe.routing.top_k();
        let (experts, inter, hidden) =
            (moe.num_experts, moe.expert_intermediate, self.params.hidden);
        self.launch(
            &kernels.permute,
            LaunchShape::new((1, 1, 1), PERMUTE_THREADS),
            GptOssPermute {
                topk_ids,
                meta: b.meta,
                sorted_tokens: b.sorted_tokens,
                row_of: b.row_of,
                count,
            },
        )?;
        self.launch(
            &kernels.gather,
            LaunchShape::new((to_u32(rows.min(GATHER_BLOCKS), "rows")?, 1, 1), THREADS),
            GptOssGather {
                x: self.act.normed.device_ptr(),
                sorted_tokens: b.sorted_tokens,
                x_perm: b.x_perm,
                count,
            },
        )?;
        let shape = tile_shape(rows, experts, inter.div_ceil(TILE_SWIGLU_COLUMNS))?;
        match gate_up {
            Matrix::Bf16(w) => self.launch(
                &kernels.gemm_gate_up,
                shape,
                GptOssGemmGateUp {
                    x_perm: b.x_perm,
                    w,
                    bias: gate_up_bias,
                    meta: b.meta,
                    act,
                },
            )?,
            Matrix::Mxfp4(blocks, scales) => self.launch(
                &kernels.gemm_gate_up_mxfp4,
                shape,
                GptOssGemmGateUpMxfp4 {
                    x_perm: b.x_perm,
                    blocks,
                    scales,
                    bias: gate_up_bias,
                    meta: b.meta,
                    act,
                },
            )?,
        }
        let shape = tile_shape(rows, experts, hidden.div_ceil(TILE_COLUMNS))?;
        match down {
            Matrix::Bf16(w) => self.launch(
                &kernels.gemm_down,
                shape,
                GptOssGemmDown {
                    act,
                    w,
                    bias: down_bias,
                    meta: b.meta,
                    y,
                },
            )?,
            Matrix::Mxfp4(blocks, scales) => self.launch(
                &kernels.gemm_down_mxfp4,
                shape,
                GptOssGemmDownMxfp4 {
                    act,
                    blocks,
                    scales,
                    bias: down_bias,
                    meta: b.meta,
                    y,
                },
            )?,
        }
        self.launch(
            &kernels.combine,
            LaunchShape::new((to_u32(t, "tokens")?, 1, 1), THREADS),
            GptOssCombine {
                y,
                row_of: Some(b.row_of),
                topk_ids,
                topk_weights,
                delta: self.act.delta.device_ptr(),
            },
        )
    }
}

/// The permutation's step buffers, for the grouped products.
#[derive(Clone, Copy)]
struct Grouped {
    /// Segment offsets, the experts with rows and their first row tiles.
    meta: DevicePtr<i32>,
    /// Each permuted row's token.
    sorted_tokens: DevicePtr<i32>,
    /// Each (token, slot)'s permuted row.
    row_of: DevicePtr<i32>,
    /// The permuted rows of the normalised input.
    x_perm: DevicePtr<Bf16>,
}
