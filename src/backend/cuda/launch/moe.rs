//! The argument structs of the mixture-of-experts kernels (`kernels/moe.cu`,
//! `kernels/moe_fp8.cu`), one per entry point, as `launch.rs` declares every kernel's.

use super::{Bf16, DevicePtr, E4m3, KernelArg, KernelArgs, MAX_KERNEL_ARGS, Parameters, Slot};

kernel_args! {
    /// The arguments of `moe_route` (`kernels/moe.cu`): each token's experts and weights.
    MoeRoute for &["moe_route"] => {
        /// The router logits, [tokens, MOE_LOGITS].
        logits: DevicePtr<f32>,
        /// The step's token ids (negative: padding).
        tokens: DevicePtr<i32>,
        /// Each token's experts, [tokens, top_k].
        topk_ids: DevicePtr<i32>,
        /// Their weights, [tokens, top_k].
        topk_weights: DevicePtr<f32>,
        /// Tokens in the step.
        count: i32,
    }

    /// The arguments of `moe_permute`: the tokens grouped by expert.
    MoePermute for &["moe_permute"] => {
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// Segment offsets, the count of experts with rows and their list.
        meta: DevicePtr<i32>,
        /// Each permuted row's token.
        sorted_tokens: DevicePtr<i32>,
        /// Each (token, slot)'s permuted row.
        row_of: DevicePtr<i32>,
        /// Tokens in the step.
        count: i32,
    }

    /// The arguments of `moe_gather`: the permuted rows of x.
    MoeGather for &["moe_gather"] => {
        /// The normalised rows, [tokens, hidden].
        x: DevicePtr<Bf16>,
        /// Each permuted row's token.
        sorted_tokens: DevicePtr<i32>,
        /// The permuted rows, [tokens × top_k, hidden].
        x_perm: DevicePtr<Bf16>,
        /// Tokens in the step.
        count: i32,
    }

    /// The arguments of `moe_route_permute`: routing, permutation and gather in one block.
    MoeRoutePermute for &["moe_route_permute"] => {
        /// The router logits.
        logits: DevicePtr<f32>,
        /// The step's token ids.
        tokens: DevicePtr<i32>,
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// Their weights.
        topk_weights: DevicePtr<f32>,
        /// Segment offsets, the count of experts with rows and their list.
        meta: DevicePtr<i32>,
        /// Each permuted row's token.
        sorted_tokens: DevicePtr<i32>,
        /// Each (token, slot)'s permuted row.
        row_of: DevicePtr<i32>,
        /// The normalised rows.
        x: DevicePtr<Bf16>,
        /// The permuted rows.
        x_perm: DevicePtr<Bf16>,
        /// Tokens in the step.
        count: i32,
    }

    /// The arguments of `moe_gate_up` and `moe_gemm_gate_up`: the grouped gate/up products with
    /// SwiGLU (small-M loops, or tensor-core tiles for many rows per expert).
    MoeGateUp for &["moe_gate_up", "moe_gemm_gate_up"] => {
        /// The permuted rows, [rows, hidden].
        x_perm: DevicePtr<Bf16>,
        /// Every expert's gate/up weights, [experts, 2 × width, hidden].
        w: DevicePtr<Bf16>,
        /// Segment offsets and the experts with rows.
        meta: DevicePtr<i32>,
        /// SwiGLU of each row's product, [rows, width].
        h_perm: DevicePtr<Bf16>,
        /// Values between x_perm's rows: hidden, or 0 for a step of one token, whose slots all
        /// read the normalised row itself (nothing gathered).
        x_stride: i32,
    }

    /// The arguments of `moe_down` and `moe_gemm_down`: the grouped down products.
    MoeDown for &["moe_down", "moe_gemm_down"] => {
        /// The SwiGLU rows, [rows, width].
        h_perm: DevicePtr<Bf16>,
        /// Every expert's down weights, [experts, hidden, width].
        w: DevicePtr<Bf16>,
        /// Segment offsets and the experts with rows.
        meta: DevicePtr<i32>,
        /// Each row's expert output, [rows, hidden].
        y_perm: DevicePtr<f32>,
    }

    /// The arguments of `moe_down_combine_one`: for a step of one token, the down product and
    /// the weighted un-permute in one.
    MoeDownCombineOne for &["moe_down_combine_one"] => {
        /// The SwiGLU rows, [top_k, width].
        h_perm: DevicePtr<Bf16>,
        /// Every expert's down weights, [experts, hidden, width].
        w: DevicePtr<Bf16>,
        /// The token's experts, [top_k].
        topk_ids: DevicePtr<i32>,
        /// Each slot's permuted row.
        row_of: DevicePtr<i32>,
        /// Each slot's weight.
        topk_weights: DevicePtr<f32>,
        /// The router logits (the shared expert's gate in the last column).
        logits: DevicePtr<f32>,
        /// The shared expert's output (`None`: no shared expert).
        shared: Option<DevicePtr<f32>>,
        /// The MLP's output, [1, hidden].
        delta: DevicePtr<f32>,
    }

    /// The arguments of `moe_shared_swiglu`: SwiGLU of the shared expert's gate/up product.
    MoeSharedSwiglu for &["moe_shared_swiglu"] => {
        /// The product, [tokens, 2 × width].
        gate_up: DevicePtr<f32>,
        /// SwiGLU of it, [tokens, width].
        out: DevicePtr<Bf16>,
    }

    /// The arguments of `moe_combine`: the un-permute with the weighted sum.
    MoeCombine for &["moe_combine"] => {
        /// Each permuted row's expert output.
        y_perm: DevicePtr<f32>,
        /// Each (token, slot)'s permuted row.
        row_of: DevicePtr<i32>,
        /// Each (token, slot)'s weight.
        topk_weights: DevicePtr<f32>,
        /// The router logits (the shared expert's gate in the last column).
        logits: DevicePtr<f32>,
        /// The shared expert's output (`None`: no shared expert).
        shared: Option<DevicePtr<f32>>,
        /// The MLP's output, [tokens, hidden].
        delta: DevicePtr<f32>,
    }
    /// The arguments of `moe_fp8_round` (`kernels/moe_fp8.cu`): the permuted rows rounded in
    /// place as FP8 experts' input scheme says.
    MoeFp8Round for &["moe_fp8_round"] => {
        /// The permuted rows, [tokens · top_k, width] bf16.
        rows: DevicePtr<Bf16>,
        /// Their width.
        width: i32,
        /// Columns per scale (0: one per row).
        group: i32,
        /// The cap on a row's largest magnitude (0: none).
        upper_bound: f32,
        /// Each expert's static input scale (`None`: dynamic scales).
        static_scales: Option<DevicePtr<f32>>,
        /// Segment offsets and the experts with rows.
        meta: DevicePtr<i32>,
    }

    /// The arguments of `moe_fp8_gate_up`: the grouped gate/up products over FP8 experts with
    /// SwiGLU (small-M loops).
    MoeFp8GateUp for &["moe_fp8_gate_up"] => {
        /// The permuted rows, [rows, hidden].
        x_perm: DevicePtr<Bf16>,
        /// Every expert's gate/up E4M3 rows in groups of 4, [experts, 2 × width, hidden].
        w: DevicePtr<E4m3>,
        /// Their scales, [experts, 2 × width, groups].
        scales: DevicePtr<f32>,
        /// Segment offsets and the experts with rows.
        meta: DevicePtr<i32>,
        /// SwiGLU of each row's product, [rows, width].
        h_perm: DevicePtr<Bf16>,
        /// Scales per weight row.
        groups: i32,
        /// Columns per scale.
        group: i32,
        /// Warps of a row group splitting K.
        splits: i32,
    }

    /// The arguments of `moe_fp8_down`: the grouped down products over FP8 experts (small-M
    /// loops).
    MoeFp8Down for &["moe_fp8_down"] => {
        /// The SwiGLU rows, [rows, width].
        h_perm: DevicePtr<Bf16>,
        /// Every expert's down E4M3 weights, [experts, hidden, width].
        w: DevicePtr<E4m3>,
        /// Their scales, [experts, hidden, groups].
        scales: DevicePtr<f32>,
        /// Segment offsets and the experts with rows.
        meta: DevicePtr<i32>,
        /// Each row's expert output, [rows, hidden].
        y_perm: DevicePtr<f32>,
        /// Scales per weight row.
        groups: i32,
        /// Columns per scale.
        group: i32,
        /// Warps of a row group splitting K.
        splits: i32,
    }

    /// The arguments of `moe_fp8_gemm_gate_up`: the same as `moe_fp8_gate_up` on tensor-core
    /// tiles (many rows per expert).
    MoeFp8GemmGateUp for &["moe_fp8_gemm_gate_up"] => {
        /// The permuted rows, [rows, hidden].
        x_perm: DevicePtr<Bf16>,
        /// Every expert's gate/up E4M3 rows in groups of 4.
        w: DevicePtr<E4m3>,
        /// Their scales.
        scales: DevicePtr<f32>,
        /// Segment offsets, the experts with rows and their first row tiles.
        meta: DevicePtr<i32>,
        /// SwiGLU of each row's product, [rows, width].
        h_perm: DevicePtr<Bf16>,
        /// Scales per weight row.
        groups: i32,
        /// Columns per scale.
        group: i32,
    }

    /// The arguments of `moe_fp8_gemm_down`: the same as `moe_fp8_down` on tensor-core tiles.
    MoeFp8GemmDown for &["moe_fp8_gemm_down"] => {
        /// The SwiGLU rows, [rows, width].
        h_perm: DevicePtr<Bf16>,
        /// Every expert's down E4M3 weights.
        w: DevicePtr<E4m3>,
        /// Their scales.
        scales: DevicePtr<f32>,
        /// Segment offsets, the experts with rows and their first row tiles.
        meta: DevicePtr<i32>,
        /// Each row's expert output, [rows, hidden].
        y_perm: DevicePtr<f32>,
        /// Scales per weight row.
        groups: i32,
        /// Columns per scale.
        group: i32,
    }
}
