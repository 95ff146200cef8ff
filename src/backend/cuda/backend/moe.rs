//! The mixture-of-experts MLP of one sparse layer as kernel launches (`kernels/moe.cu`): the
//! router's product, the routing and the permutation on the device, the grouped expert products
//! over the experts that have rows, the shared expert, and the weighted un-permute into
//! `act.delta`. Every size a kernel needs beyond the step's token count stays on the device, so
//! the launches can be captured in a CUDA graph.

use std::collections::HashMap;

use cudarc::driver::{CudaFunction, DriverError};

use crate::engine::BackendError;
use crate::model::MoeDefinition;

use crate::backend::cuda::compile::KernelError;
use crate::backend::cuda::inputs::StepLayout;
use crate::backend::cuda::launch::{
    Bf16, DevicePtr, Kernel, LaunchShape, MoeCombine, MoeDown, MoeDownCombineOne, MoeGateUp,
    MoeGather, MoePermute, MoeRoute, MoeRoutePermute, MoeSharedSwiglu,
};
use crate::backend::cuda::moe::{ExpertWeights, Fp8ExpertOperand};
use crate::backend::cuda::plan;

use super::moe_fp8::{Fp8Buffers, MoeFp8Kernels};
use super::products::{TimedProduct, TimedShape};
use super::{CudaBackend, to_u32};

/// Warps per block of the routing kernels (`MOE_ROUTE_WARPS` in `kernels/moe.cu`).
const ROUTE_WARPS: usize = 4;

/// Threads of the permutation's one block.
const PERMUTE_THREADS: u32 = 1024;

/// Threads per block of the element-wise kernels (gather, shared SwiGLU, combine).
const THREADS: u32 = 256;

/// Most blocks of the gather (each copies whole rows, in turn).
const GATHER_BLOCKS: usize = 4096;

/// Rows and columns of a tile of the tensor-core grouped GEMMs (`MOE_BM`, `MOE_BN` in
/// `kernels/moe.cu`), and their threads.
const GEMM_TILE: usize = 64;
const GEMM_THREADS: u32 = 128;

/// Rows per expert, on average over the step, from which the expert products take the
/// tensor-core tiles (each expert's weights read once per 64 rows) instead of the small-M loops
/// (read once per 8 rows).
const GEMM_FROM_ROWS_PER_EXPERT: usize = 16;

/// Output columns per block of `moe_down_combine_one` (`MOE_ONE_ROWS`), and its most warps (one
/// per slot, `MOE_ONE_WARPS`).
const ONE_ROWS: usize = 4;
const ONE_MAX_WARPS: usize = 8;

/// The entry points of `kernels/moe.cu`.
pub(super) struct MoeKernels {
    /// FP8 experts' kernels (`kernels/moe_fp8.cu`).
    pub(super) fp8: MoeFp8Kernels,
    route: Kernel<MoeRoute>,
    permute: Kernel<MoePermute>,
    gather: Kernel<MoeGather>,
    route_permute: Kernel<MoeRoutePermute>,
    gate_up: Kernel<MoeGateUp>,
    down: Kernel<MoeDown>,
    gemm_gate_up: Kernel<MoeGateUp>,
    gemm_down: Kernel<MoeDown>,
    down_combine_one: Kernel<MoeDownCombineOne>,
    shared_swiglu: Kernel<MoeSharedSwiglu>,
    combine: Kernel<MoeCombine>,
}

impl MoeKernels {
    /// The kernels out of the loaded `map`, or `None` when the family was not compiled (a model
    /// without experts).
    pub(super) fn take(
        map: &mut HashMap<&'static str, CudaFunction>,
    ) -> Result<Option<Self>, KernelError> {
        if !map.contains_key("moe_route") {
            return Ok(None);
        }
        Ok(Some(Self {
            route: Kernel::take(map, "moe_route")?,
            permute: Kernel::take(map, "moe_permute")?,
            gather: Kernel::take(map, "moe_gather")?,
            route_permute: Kernel::take(map, "moe_route_permute")?,
            gate_up: Kernel::take(map, "moe_gate_up")?,
            down: Kernel::take(map, "moe_down")?,
            gemm_gate_up: Kernel::take(map, "moe_gemm_gate_up")?,
            gemm_down: Kernel::take(map, "moe_gemm_down")?,
            down_combine_one: Kernel::take(map, "moe_down_combine_one")?,
            shared_swiglu: Kernel::take(map, "moe_shared_swiglu")?,
            combine: Kernel::take(map, "moe_combine")?,
            fp8: MoeFp8Kernels::take(map)?,
        }))
    }

    /// Lets the grouped products use the small-M loops' shared-memory rings (`bytes`).
    pub(super) fn allow_dynamic_shared(&self, bytes: usize) -> Result<(), DriverError> {
        if bytes > 0 {
            self.gate_up.allow_dynamic_shared(bytes)?;
            self.down.allow_dynamic_shared(bytes)?;
        }
        Ok(())
    }
}

/// The launch of a tensor-core grouped product (`moe_gemm_*`, `moe_fp8_gemm_*`) of `columns`
/// column blocks over a step of `rows` permuted rows among `experts` experts: row tiles of the
/// step at most, every expert's rows in 64-row tiles, one partial tile per expert with rows;
/// those past the step's count return at once.
pub(super) fn tile_shape(
    rows: usize,
    experts: usize,
    columns: usize,
) -> Result<LaunchShape, BackendError> {
    let tiles = to_u32(rows.div_ceil(GEMM_TILE) + experts.min(rows), "row tiles")?;
    Ok(LaunchShape::new(
        (to_u32(columns, "product columns")?, tiles, 1),
        GEMM_THREADS,
    ))
}

/// Where a layer's expert weights are, as its products take them.
#[derive(Clone, Copy)]
enum Experts {
    /// bf16 gate/up and down.
    Bf16(DevicePtr<Bf16>, DevicePtr<Bf16>),
    /// FP8 gate/up and down.
    Fp8(Fp8ExpertOperand, Fp8ExpertOperand),
}

impl CudaBackend {
    /// Whether a step of `rows` permuted rows among `experts` experts takes the tensor-core
    /// grouped products (each expert's weights read once per 64 rows) rather than the small-M
    /// loops.
    pub(super) fn takes_tiles(&self, rows: usize, experts: usize) -> bool {
        self.params.gemv_tensor_cores && rows >= GEMM_FROM_ROWS_PER_EXPERT * experts
    }

    /// The products of the sparse layers that the small-M kernels may serve at decode, for
    /// `choose_small_m_products` to time: the router's (with the shared expert's gate) and the
    /// shared expert's two.
    pub(super) fn moe_timed_shapes(&self, max_m: usize) -> Vec<TimedShape> {
        let (Some(moe), Some(s)) = (self.params.moe, self.act.moe.as_ref()) else {
            return Vec::new();
        };
        // gpt-oss's experts time none (kernels/gpt_oss.cu).
        if moe.experts != crate::model::ExpertKind::SwiGlu {
            return Vec::new();
        }
        let hidden = self.params.hidden;
        let layers: Vec<_> = self.weights.layers.iter().filter_map(|l| l.moe()).collect();
        let normed = self.act.normed.device_ptr();
        let mut shapes = vec![TimedShape {
            what: TimedProduct::Plain {
                out: s.logits.device_ptr(),
            },
            x: normed,
            weights: layers.iter().map(|l| l.router.device_ptr()).collect(),
            n: moe.num_experts + usize::from(moe.shared_expert.is_some()),
            k: hidden,
            max_m,
        }];
        if let (Some(width), Some(b)) = (moe.shared_expert, s.shared.as_ref()) {
            let shared: Vec<_> = layers.iter().filter_map(|l| l.shared.as_ref()).collect();
            shapes.push(TimedShape {
                what: TimedProduct::Plain {
                    out: b.gate_up.device_ptr(),
                },
                x: normed,
                weights: shared.iter().map(|w| w.gate_up.device_ptr()).collect(),
                n: 2 * width,
                k: hidden,
                max_m,
            });
            shapes.push(TimedShape {
                what: TimedProduct::Plain {
                    out: b.out.device_ptr(),
                },
                x: b.mlp.device_ptr(),
                weights: shared.iter().map(|w| w.down.device_ptr()).collect(),
                n: hidden,
                k: width,
                max_m,
            });
        }
        shapes
    }

    /// Layer `layer`'s mixture of experts over the step's `act.normed` rows, into `act.delta`.
    /// A step of one token (decode at batch 1) runs the down product and the combine as one
    /// kernel (`moe_down_combine_one`), after the shared expert.
    pub(super) fn moe_mlp(
        &mut self,
        layer: usize,
        moe: &MoeDefinition,
        layout: &StepLayout,
    ) -> Result<(), BackendError> {
        let missing = |what: &str| BackendError::Device(format!("layer {layer} has no {what}"));
        let t = layout.num_tokens;
        let count = to_u32(t, "tokens")? as i32;
        let hidden = self.params.hidden;
        let top_k = moe.routing.top_k();
        let logits_n = moe.num_experts + usize::from(moe.shared_expert.is_some());
        let weights = self.weights.layers[layer]
            .moe()
            .ok_or_else(|| missing("experts"))?;
        let router = weights.router.device_ptr();
        let experts = match &weights.experts {
            ExpertWeights::Bf16 { gate_up, down } => {
                Experts::Bf16(gate_up.device_ptr(), down.device_ptr())
            }
            ExpertWeights::Fp8 { gate_up, down } => Experts::Fp8(gate_up.operand(), down.operand()),
        };
        let s = self
            .act
            .moe
            .as_ref()
            .ok_or_else(|| missing("expert buffers"))?;
        let (logits, topk_ids, topk_weights, meta) = (
            s.logits.device_ptr(),
            s.topk_ids.device_ptr(),
            s.topk_weights.device_ptr(),
            s.meta.device_ptr(),
        );
        let (sorted_tokens, row_of, x_perm, h_perm, y_perm) = (
            s.sorted_tokens.device_ptr(),
            s.row_of.device_ptr(),
            s.x_perm.device_ptr(),
            s.h_perm.device_ptr(),
            s.y_perm.device_ptr(),
        );
        let normed = self.act.normed.device_ptr();
        let tokens = self.input(layout.tokens());

        self.matmul(normed, router, logits, (t, logits_n, hidden))?;
        let kernels = self
            .kernels
            .moe
            .as_ref()
            .ok_or_else(|| missing("kernels"))?;
        if t <= plan::GEMV_MAX_M {
            self.launch(
                &kernels.route_permute,
                LaunchShape::new((1, 1, 1), (ROUTE_WARPS * 32) as u32),
                MoeRoutePermute {
                    logits,
                    tokens,
                    topk_ids,
                    topk_weights,
                    meta,
                    sorted_tokens,
                    row_of,
                    x: normed,
                    x_perm,
                    count,
                },
            )?;
        } else {
            self.launch(
                &kernels.route,
                LaunchShape::new(
                    (to_u32(t.div_ceil(ROUTE_WARPS), "tokens")?, 1, 1),
                    (ROUTE_WARPS * 32) as u32,
                ),
                MoeRoute {
                    logits,
                    tokens,
                    topk_ids,
                    topk_weights,
                    count,
                },
            )?;
            self.launch(
                &kernels.permute,
                LaunchShape::new((1, 1, 1), PERMUTE_THREADS),
                MoePermute {
                    topk_ids,
                    meta,
                    sorted_tokens,
                    row_of,
                    count,
                },
            )?;
            self.launch(
                &kernels.gather,
                LaunchShape::new(
                    (to_u32((t * top_k).min(GATHER_BLOCKS), "rows")?, 1, 1),
                    THREADS,
                ),
                MoeGather {
                    x: normed,
                    sorted_tokens,
                    x_perm,
                    count,
                },
            )?;
        }
        let (gate_up_w, down_w) = match experts {
            Experts::Bf16(gate_up, down) => (gate_up, down),
            Experts::Fp8(gate_up, down) => {
                if t == 1 {
                    // The FP8 products read gathered rows, which they round in place.
                    self.launch(
                        &kernels.gather,
                        LaunchShape::new((to_u32(top_k, "slots")?, 1, 1), THREADS),
                        MoeGather {
                            x: normed,
                            sorted_tokens,
                            x_perm,
                            count,
                        },
                    )?;
                }
                let buffers = Fp8Buffers {
                    meta,
                    x_perm,
                    h_perm,
                    y_perm,
                };
                self.moe_fp8_products(moe, t, (gate_up, down), buffers)?;
                return self.moe_finish(layer, moe, layout, None, (h_perm, y_perm));
            }
        };
        // One token: `moe_route_permute` gathers nothing, and every slot reads the normalised row.
        let (x_rows, x_stride) = if t == 1 {
            (normed, 0)
        } else {
            (x_perm, to_u32(hidden, "hidden")? as i32)
        };
        let (gate_up_args, down_args) = (
            MoeGateUp {
                x_perm: x_rows,
                w: gate_up_w,
                meta,
                h_perm,
                x_stride,
            },
            MoeDown {
                h_perm,
                w: down_w,
                meta,
                y_perm,
            },
        );
        let rows = t * top_k;
        if self.takes_tiles(rows, moe.num_experts) {
            let shape = |columns: usize| tile_shape(rows, moe.num_experts, columns);
            let inter = moe.expert_intermediate;
            self.launch(
                &kernels.gemm_gate_up,
                shape(inter.div_ceil(GEMM_TILE / 2))?,
                gate_up_args,
            )?;
            self.launch(
                &kernels.gemm_down,
                shape(hidden.div_ceil(GEMM_TILE))?,
                down_args,
            )?;
        } else {
            // One block column per expert that can have rows; those past the step's count of
            // experts with rows return at once.
            let active = to_u32(moe.num_experts.min(rows), "experts")?;
            let geometry = self.params.gemv_geometry(1);
            let shape = |columns: usize| -> Result<LaunchShape, BackendError> {
                Ok(LaunchShape::new(
                    (to_u32(columns, "product rows")?, active, 1),
                    geometry.threads as u32,
                )
                .with_shared(geometry.shared_bytes as u32))
            };
            self.launch(
                &kernels.gate_up,
                shape(moe.expert_intermediate / (geometry.rows / 2))?,
                gate_up_args,
            )?;
            // One token: the down product runs with the combine, below.
            if t > 1 {
                self.launch(
                    &kernels.down,
                    shape(hidden.div_ceil(geometry.rows))?,
                    down_args,
                )?;
            }
        }
        self.moe_finish(layer, moe, layout, Some(down_w), (h_perm, y_perm))
    }

    /// The end of layer `layer`'s mixture after the expert products: the shared expert, then
    /// the weighted un-permute into `act.delta`, for a step of one token with bf16 experts
    /// (`down_w` given) the down product with it (`moe_down_combine_one`).
    fn moe_finish(
        &mut self,
        layer: usize,
        moe: &MoeDefinition,
        layout: &StepLayout,
        down_w: Option<DevicePtr<Bf16>>,
        (h_perm, y_perm): (DevicePtr<Bf16>, DevicePtr<f32>),
    ) -> Result<(), BackendError> {
        let missing = |what: &str| BackendError::Device(format!("layer {layer} has no {what}"));
        let t = layout.num_tokens;
        let count = to_u32(t, "tokens")? as i32;
        let hidden = self.params.hidden;
        let top_k = moe.routing.top_k();
        let weights = self.weights.layers[layer]
            .moe()
            .ok_or_else(|| missing("experts"))?;
        let shared_w = weights
            .shared
            .as_ref()
            .map(|s| (s.gate_up.device_ptr(), s.down.device_ptr()));
        let s = self
            .act
            .moe
            .as_ref()
            .ok_or_else(|| missing("expert buffers"))?;
        let (logits, topk_ids, topk_weights, row_of) = (
            s.logits.device_ptr(),
            s.topk_ids.device_ptr(),
            s.topk_weights.device_ptr(),
            s.row_of.device_ptr(),
        );
        let shared_bufs = s.shared.as_ref().map(|b| {
            (
                b.gate_up.device_ptr(),
                b.mlp.device_ptr(),
                b.out.device_ptr(),
            )
        });
        let normed = self.act.normed.device_ptr();
        let shared_out = match (moe.shared_expert, shared_w, shared_bufs) {
            (Some(width), Some((gate_up_w, down_w)), Some((gate_up, mlp, out))) => {
                self.matmul(normed, gate_up_w, gate_up, (t, 2 * width, hidden))?;
                let kernels = self
                    .kernels
                    .moe
                    .as_ref()
                    .ok_or_else(|| missing("kernels"))?;
                self.launch(
                    &kernels.shared_swiglu,
                    LaunchShape::new(
                        (
                            to_u32(width.div_ceil(THREADS as usize), "width")?,
                            count as u32,
                            1,
                        ),
                        THREADS,
                    ),
                    MoeSharedSwiglu { gate_up, out: mlp },
                )?;
                self.matmul(mlp, down_w, out, (t, hidden, width))?;
                Some(out)
            }
            (None, _, _) => None,
            _ => return Err(missing("shared expert")),
        };
        let kernels = self
            .kernels
            .moe
            .as_ref()
            .ok_or_else(|| missing("kernels"))?;
        if let (1, Some(down_w)) = (t, down_w) {
            return self.launch(
                &kernels.down_combine_one,
                LaunchShape::new(
                    (to_u32(hidden.div_ceil(ONE_ROWS), "hidden")?, 1, 1),
                    (32 * top_k.min(ONE_MAX_WARPS)) as u32,
                ),
                MoeDownCombineOne {
                    h_perm,
                    w: down_w,
                    topk_ids,
                    row_of,
                    topk_weights,
                    logits,
                    shared: shared_out,
                    delta: self.act.delta.device_ptr(),
                },
            );
        }
        self.launch(
            &kernels.combine,
            LaunchShape::new((count as u32, 1, 1), THREADS),
            MoeCombine {
                y_perm,
                row_of,
                topk_weights,
                logits,
                shared: shared_out,
                delta: self.act.delta.device_ptr(),
            },
        )
    }
}
