//! The argument structs of gpt-oss's expert kernels (`kernels/gpt_oss.cu`), one per entry point,
//! as `launch.rs` declares every kernel's.

use super::{
    Bf16, DevicePtr, E2m1x2, E8m0, KernelArg, KernelArgs, MAX_KERNEL_ARGS, Parameters, Slot,
};

kernel_args! {
    /// The arguments of `gptoss_route`: each token's experts and weights.
    GptOssRoute for &["gptoss_route"] => {
        /// The router's product without its bias, [tokens, experts].
        logits: DevicePtr<f32>,
        /// The router's bias, [experts].
        bias: DevicePtr<Bf16>,
        /// Each token's experts, [tokens, top_k].
        topk_ids: DevicePtr<i32>,
        /// Their weights, [tokens, top_k].
        topk_weights: DevicePtr<f32>,
        /// Tokens in the step.
        count: i32,
    }

    /// The arguments of `gptoss_gate_up`: each slot's expert's gate/up product, biased, through
    /// the clamped SwiGLU.
    GptOssGateUp for &["gptoss_gate_up"] => {
        /// The normalised rows, [tokens, hidden].
        x: DevicePtr<Bf16>,
        /// Every expert's interleaved gate/up projection, [experts, 2 · width, hidden].
        w: DevicePtr<Bf16>,
        /// Their biases, [experts, 2 · width].
        bias: DevicePtr<Bf16>,
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// The activations, [tokens · top_k, width].
        act: DevicePtr<Bf16>,
    }

    /// The arguments of `gptoss_gate_up_mxfp4`: the same over experts kept in MXFP4.
    GptOssGateUpMxfp4 for &["gptoss_gate_up_mxfp4"] => {
        /// The normalised rows, [tokens, hidden].
        x: DevicePtr<Bf16>,
        /// Every expert's interleaved gate/up blocks, [experts, 2 · width, hidden / 2] bytes.
        blocks: DevicePtr<E2m1x2>,
        /// Their scales, [experts, 2 · width, hidden / 32].
        scales: DevicePtr<E8m0>,
        /// The biases, [experts, 2 · width].
        bias: DevicePtr<Bf16>,
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// The activations, [tokens · top_k, width].
        act: DevicePtr<Bf16>,
    }

    /// The arguments of `gptoss_down`: each slot's expert's down product, biased.
    GptOssDown for &["gptoss_down"] => {
        /// The activations, [tokens · top_k, width].
        act: DevicePtr<Bf16>,
        /// Every expert's down projection, [experts, hidden, width].
        w: DevicePtr<Bf16>,
        /// Their biases, [experts, hidden].
        bias: DevicePtr<Bf16>,
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// The slots' outputs, [tokens · top_k, hidden].
        y: DevicePtr<f32>,
    }

    /// The arguments of `gptoss_down_mxfp4`: the same over experts kept in MXFP4.
    GptOssDownMxfp4 for &["gptoss_down_mxfp4"] => {
        /// The activations, [tokens · top_k, width].
        act: DevicePtr<Bf16>,
        /// Every expert's down blocks, [experts, hidden, width / 2] bytes.
        blocks: DevicePtr<E2m1x2>,
        /// Their scales, [experts, hidden, width / 32].
        scales: DevicePtr<E8m0>,
        /// The biases, [experts, hidden].
        bias: DevicePtr<Bf16>,
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// The slots' outputs, [tokens · top_k, hidden].
        y: DevicePtr<f32>,
    }

    /// The arguments of `gptoss_combine`: each token's weighted sum of its slots' outputs.
    GptOssCombine for &["gptoss_combine"] => {
        /// The slots' outputs.
        y: DevicePtr<f32>,
        /// Each slot's row of `y` (the grouped products' permutation); `None`: row = slot.
        row_of: Option<DevicePtr<i32>>,
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// Their weights.
        topk_weights: DevicePtr<f32>,
        /// The MLP's output, [tokens, hidden].
        delta: DevicePtr<f32>,
    }

    /// The arguments of `gptoss_add_bias`: the output projection's bias added to its product.
    GptOssAddBias for &["gptoss_add_bias"] => {
        /// The output projection's product, [tokens, hidden].
        delta: DevicePtr<f32>,
        /// Its bias, [hidden].
        bias: DevicePtr<Bf16>,
    }

    /// The arguments of `gptoss_permute`: the (token, slot) pairs grouped by expert.
    GptOssPermute for &["gptoss_permute"] => {
        /// Each token's experts.
        topk_ids: DevicePtr<i32>,
        /// Segment offsets, the experts with rows and their first row tiles.
        meta: DevicePtr<i32>,
        /// Each permuted row's token.
        sorted_tokens: DevicePtr<i32>,
        /// Each (token, slot)'s permuted row.
        row_of: DevicePtr<i32>,
        /// Tokens in the step.
        count: i32,
    }

    /// The arguments of `gptoss_gather`: the permuted rows of x.
    GptOssGather for &["gptoss_gather"] => {
        /// The normalised rows, [tokens, hidden].
        x: DevicePtr<Bf16>,
        /// Each permuted row's token.
        sorted_tokens: DevicePtr<i32>,
        /// The permuted rows, [tokens · top_k, hidden].
        x_perm: DevicePtr<Bf16>,
        /// Tokens in the step.
        count: i32,
    }

    /// The arguments of `gptoss_gemm_gate_up`: the grouped gate/up products over bf16 experts,
    /// biased, through the clamped SwiGLU.
    GptOssGemmGateUp for &["gptoss_gemm_gate_up"] => {
        /// The permuted rows, [rows, hidden].
        x_perm: DevicePtr<Bf16>,
        /// Every expert's interleaved gate/up projection, [experts, 2 · width, hidden].
        w: DevicePtr<Bf16>,
        /// Their biases, [experts, 2 · width].
        bias: DevicePtr<Bf16>,
        /// Segment offsets, the experts with rows and their first row tiles.
        meta: DevicePtr<i32>,
        /// The activations, [rows, width].
        act: DevicePtr<Bf16>,
    }

    /// The arguments of `gptoss_gemm_gate_up_mxfp4`: the same over MXFP4 experts.
    GptOssGemmGateUpMxfp4 for &["gptoss_gemm_gate_up_mxfp4"] => {
        /// The permuted rows, [rows, hidden].
        x_perm: DevicePtr<Bf16>,
        /// Every expert's interleaved gate/up blocks, [experts, 2 · width, hidden / 2] bytes.
        blocks: DevicePtr<E2m1x2>,
        /// Their scales, [experts, 2 · width, hidden / 32].
        scales: DevicePtr<E8m0>,
        /// The biases, [experts, 2 · width].
        bias: DevicePtr<Bf16>,
        /// Segment offsets, the experts with rows and their first row tiles.
        meta: DevicePtr<i32>,
        /// The activations, [rows, width].
        act: DevicePtr<Bf16>,
    }

    /// The arguments of `gptoss_gemm_down`: the grouped down products over bf16 experts, biased.
    GptOssGemmDown for &["gptoss_gemm_down"] => {
        /// The activations, [rows, width].
        act: DevicePtr<Bf16>,
        /// Every expert's down projection, [experts, hidden, width].
        w: DevicePtr<Bf16>,
        /// Their biases, [experts, hidden].
        bias: DevicePtr<Bf16>,
        /// Segment offsets, the experts with rows and their first row tiles.
        meta: DevicePtr<i32>,
        /// The permuted rows' outputs, [rows, hidden].
        y: DevicePtr<f32>,
    }

    /// The arguments of `gptoss_gemm_down_mxfp4`: the same over MXFP4 experts.
    GptOssGemmDownMxfp4 for &["gptoss_gemm_down_mxfp4"] => {
        /// The activations, [rows, width].
        act: DevicePtr<Bf16>,
        /// Every expert's down blocks, [experts, hidden, width / 2] bytes.
        blocks: DevicePtr<E2m1x2>,
        /// Their scales, [experts, hidden, width / 32].
        scales: DevicePtr<E8m0>,
        /// The biases, [experts, hidden].
        bias: DevicePtr<Bf16>,
        /// Segment offsets, the experts with rows and their first row tiles.
        meta: DevicePtr<i32>,
        /// The permuted rows' outputs, [rows, hidden].
        y: DevicePtr<f32>,
    }
}
