//! The argument structs of the mixture-of-experts kernels (`kernels/moe.cu`), one per entry
//! point, as `launch.rs` declares every kernel's.

use super::{Bf16, DevicePtr, KernelArg, KernelArgs, MAX_KERNEL_ARGS, Parameters, Slot};

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
}
