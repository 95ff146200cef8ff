//! The expert products of a mixture whose experts are FP8 (`kernels/moe_fp8.cu`), after
//! `moe.rs`'s routing, permutation and gather: the permuted rows rounded as the experts' input
//! scheme says, the grouped gate/up product with SwiGLU, the SwiGLU rows rounded the same way for
//! the down projection, and the grouped down product, on the small-M loops (the weights read once
//! per 8 rows of an expert, widened in registers) or, for many rows per expert, on tensor-core
//! tiles whose weights are widened to bf16 as they are loaded. NOT YET RUN ON A GPU.

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use crate::engine::BackendError;
use crate::model::MoeDefinition;

use crate::backend::cuda::compile::KernelError;
use crate::backend::cuda::fp8::{GemvGeometry, quant_threads};
use crate::backend::cuda::launch::{
    Bf16, DevicePtr, Kernel, LaunchShape, MoeFp8Down, MoeFp8GateUp, MoeFp8GemmDown,
    MoeFp8GemmGateUp, MoeFp8Round,
};
use crate::backend::cuda::moe::Fp8ExpertOperand;

use super::moe::tile_shape;
use super::{CudaBackend, to_u32};

/// Columns per block of the tile products' gate/up launch: 64 columns of weights, 32 of SwiGLU
/// output (`MOE_BN / 2`).
const TILE_SWIGLU_COLUMNS: usize = 32;

/// Columns per block of the tile products' down launch (`MOE_BN`).
const TILE_COLUMNS: usize = 64;

/// The entry points of `kernels/moe_fp8.cu`.
pub(super) struct MoeFp8Kernels {
    round: Kernel<MoeFp8Round>,
    gate_up: Kernel<MoeFp8GateUp>,
    down: Kernel<MoeFp8Down>,
    gemm_gate_up: Kernel<MoeFp8GemmGateUp>,
    gemm_down: Kernel<MoeFp8GemmDown>,
}

impl MoeFp8Kernels {
    /// The kernels out of the loaded `map` (compiled with `kernels/moe.cu`'s).
    pub(super) fn take(map: &mut HashMap<&'static str, CudaFunction>) -> Result<Self, KernelError> {
        Ok(Self {
            round: Kernel::take(map, "moe_fp8_round")?,
            gate_up: Kernel::take(map, "moe_fp8_gate_up")?,
            down: Kernel::take(map, "moe_fp8_down")?,
            gemm_gate_up: Kernel::take(map, "moe_fp8_gemm_gate_up")?,
            gemm_down: Kernel::take(map, "moe_fp8_gemm_down")?,
        })
    }
}

/// The step buffers the FP8 products read and write.
#[derive(Clone, Copy)]
pub(super) struct Fp8Buffers {
    /// The permutation's segments and experts with rows.
    pub meta: DevicePtr<i32>,
    /// The gathered rows, `[rows, hidden]` (rounded in place).
    pub x_perm: DevicePtr<Bf16>,
    /// The SwiGLU rows, `[rows, intermediate]` (rounded in place).
    pub h_perm: DevicePtr<Bf16>,
    /// The experts' outputs, `[rows, hidden]` fp32.
    pub y_perm: DevicePtr<f32>,
}

/// An i32 kernel argument out of a size.
fn int(value: usize, what: &str) -> Result<i32, BackendError> {
    i32::try_from(value).map_err(|_| BackendError::Device(format!("{what} {value} exceeds i32")))
}

impl CudaBackend {
    /// The expert products of a step of `t` tokens over FP8 experts (`gate_up`, `down`), from
    /// the gathered rows in `b.x_perm` to the experts' outputs in `b.y_perm`.
    pub(super) fn moe_fp8_products(
        &self,
        moe: &MoeDefinition,
        t: usize,
        (gate_up, down): (Fp8ExpertOperand, Fp8ExpertOperand),
        b: Fp8Buffers,
    ) -> Result<(), BackendError> {
        let kernels = &self
            .kernels
            .moe
            .as_ref()
            .ok_or_else(|| BackendError::Device("the mixture's kernels are not loaded".into()))?
            .fp8;
        let (hidden, inter) = (self.params.hidden, moe.expert_intermediate);
        let rows = t * moe.routing.top_k();
        self.moe_fp8_round(kernels, &gate_up, b.x_perm, hidden, rows, b.meta)?;
        if self.takes_tiles(rows, moe.num_experts) {
            self.launch(
                &kernels.gemm_gate_up,
                tile_shape(rows, moe.num_experts, inter.div_ceil(TILE_SWIGLU_COLUMNS))?,
                MoeFp8GemmGateUp {
                    x_perm: b.x_perm,
                    w: gate_up.values,
                    scales: gate_up.scales,
                    meta: b.meta,
                    h_perm: b.h_perm,
                    groups: int(gate_up.groups, "scale groups")?,
                    group: int(gate_up.group, "scale group")?,
                },
            )?;
            self.moe_fp8_round(kernels, &down, b.h_perm, inter, rows, b.meta)?;
            return self.launch(
                &kernels.gemm_down,
                tile_shape(rows, moe.num_experts, hidden.div_ceil(TILE_COLUMNS))?,
                MoeFp8GemmDown {
                    h_perm: b.h_perm,
                    w: down.values,
                    scales: down.scales,
                    meta: b.meta,
                    y_perm: b.y_perm,
                    groups: int(down.groups, "scale groups")?,
                    group: int(down.group, "scale group")?,
                },
            );
        }
        // One block column per expert that can have rows; those past the step's count of
        // experts with rows return at once. Row groups of 4 weight rows (two SwiGLU pairs of
        // gate/up), K split as for a dense product of one row.
        let active = to_u32(moe.num_experts.min(rows), "experts")?;
        let shape = |geometry: GemvGeometry, n: usize| -> Result<LaunchShape, BackendError> {
            Ok(LaunchShape::new(
                (to_u32(geometry.blocks(n), "product rows")?, active, 1),
                geometry.threads(),
            ))
        };
        let geometry = GemvGeometry::choose(1, 2 * inter, hidden, 0);
        self.launch(
            &kernels.gate_up,
            shape(geometry, 2 * inter)?,
            MoeFp8GateUp {
                x_perm: b.x_perm,
                w: gate_up.values,
                scales: gate_up.scales,
                meta: b.meta,
                h_perm: b.h_perm,
                groups: int(gate_up.groups, "scale groups")?,
                group: int(gate_up.group, "scale group")?,
                splits: int(geometry.splits, "splits")?,
            },
        )?;
        self.moe_fp8_round(kernels, &down, b.h_perm, inter, rows, b.meta)?;
        let geometry = GemvGeometry::choose(1, hidden, inter, 0);
        self.launch(
            &kernels.down,
            shape(geometry, hidden)?,
            MoeFp8Down {
                h_perm: b.h_perm,
                w: down.values,
                scales: down.scales,
                meta: b.meta,
                y_perm: b.y_perm,
                groups: int(down.groups, "scale groups")?,
                group: int(down.group, "scale group")?,
                splits: int(geometry.splits, "splits")?,
            },
        )
    }

    /// The `rows` permuted rows at `x` (`width` wide) rounded in place as `operand`'s input
    /// scheme says; nothing for weight-only FP8.
    fn moe_fp8_round(
        &self,
        kernels: &MoeFp8Kernels,
        operand: &Fp8ExpertOperand,
        x: DevicePtr<Bf16>,
        width: usize,
        rows: usize,
        meta: DevicePtr<i32>,
    ) -> Result<(), BackendError> {
        let Some(input) = operand.input else {
            return Ok(());
        };
        self.launch(
            &kernels.round,
            LaunchShape::new(
                (
                    to_u32(rows, "rows")?,
                    to_u32(input.groups(width), "groups")?,
                    1,
                ),
                // A multiple of 32 covering a group once, at most `MOE_FP8_ROUND_THREADS`.
                quant_threads(if input.group == 0 { width } else { input.group }),
            ),
            MoeFp8Round {
                rows: x,
                width: int(width, "width")?,
                group: int(input.group, "group")?,
                upper_bound: input.upper_bound,
                static_scales: operand.static_scales,
                meta,
            },
        )
    }
}
