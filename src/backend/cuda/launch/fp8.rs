//! The argument structs of the FP8 kernels (`kernels/fp8.cu`), one per entry point or entry
//! family, as `launch.rs` declares every kernel's.

use super::super::kernels::{FP8_GEMV_ENTRIES, FP8_GEMV_QKV_ROPE_ENTRIES, FP8_GEMV_SWIGLU_ENTRIES};
use super::{
    Bf16, DevicePtr, E4m3, KernelArg, KernelArgs, MAX_KERNEL_ARGS, Parameters, RopeWrites, Slot,
};

kernel_args! {
    /// The arguments of `fp8_quantize_input` (`kernels/fp8.cu`).
    Fp8QuantizeInput for &["fp8_quantize_input"] => {
        /// The product's input, [tokens, k] bf16.
        x: DevicePtr<Bf16>,
        /// Its width.
        k: i32,
        /// Columns per scale (0: one per token).
        group: i32,
        /// The cap on a token's largest magnitude (0: none).
        upper_bound: f32,
        /// The static scale (0: dynamic).
        static_scale: f32,
        /// The E4M3 codes, [tokens, k].
        xq: DevicePtr<E4m3>,
        /// The codes times their scales in bf16, [tokens, k].
        xd: DevicePtr<Bf16>,
        /// The scales, [tokens, groups].
        scales: DevicePtr<f32>,
    }

    /// The arguments of `fp8_gemv_m1` … `fp8_gemv_m8` and `fp8_gemv_r4_m1` … `fp8_gemv_r4_m8`
    /// (`kernels/fp8.cu`).
    Fp8Gemv for &FP8_GEMV_ENTRIES => {
        /// The input rows, [m, k] bf16.
        x: DevicePtr<Bf16>,
        /// The E4M3 weights, [n, k].
        w: DevicePtr<E4m3>,
        /// The weight scales, [n, groups].
        scales: DevicePtr<f32>,
        /// The product, [m, n] fp32.
        out: DevicePtr<f32>,
        /// The product's rows.
        n: i32,
        /// The product's depth.
        k: i32,
        /// Scales per weight row.
        groups: i32,
        /// Columns per scale.
        group: i32,
        /// Warps of a row group splitting K (`fp8::GemvGeometry::splits`).
        splits: i32,
    }

    /// The arguments of `fp8_add_rmsnorm` (`kernels/fp8.cu`).
    Fp8AddRmsnorm for &["fp8_add_rmsnorm"] => {
        /// The residual stream, [rows, hidden], to which `delta` is added.
        residual: DevicePtr<f32>,
        /// What is added to the residual stream first (`None`: nothing).
        delta: Option<DevicePtr<f32>>,
        /// The product's per-token input scales when `delta` is its unscaled product of the
        /// codes (the same buffer as `scales`), else `None`.
        x_scales: Option<DevicePtr<f32>>,
        /// The product's per-row weight scales in that case, else `None`.
        w_scales: Option<DevicePtr<f32>>,
        /// The norm's weight, [hidden].
        weight: DevicePtr<Bf16>,
        /// The normalised rows, [rows, hidden].
        out: DevicePtr<Bf16>,
        /// The cap on a row's largest magnitude (0: none).
        upper_bound: f32,
        /// The static scale (0: dynamic).
        static_scale: f32,
        /// The E4M3 codes, [rows, hidden].
        xq: DevicePtr<E4m3>,
        /// The codes times their scales in bf16, [rows, hidden].
        xd: DevicePtr<Bf16>,
        /// The scales, [rows].
        scales: DevicePtr<f32>,
    }

    /// The arguments of `fp8_swiglu_quantize` (`kernels/fp8.cu`).
    Fp8SwigluQuantize for &["fp8_swiglu_quantize"] => {
        /// The gate/up product, [tokens, 2 * intermediate] fp32, gate half first.
        gate_up: DevicePtr<f32>,
        /// The gate/up input's per-token scales when `gate_up` is the unscaled product of the
        /// codes (the same buffer as `scales`), else `None`.
        x_scales: Option<DevicePtr<f32>>,
        /// The gate/up weights' per-row scales in that case, else `None`.
        w_scales: Option<DevicePtr<f32>>,
        /// Columns per scale; 0: one scale per token.
        group: i32,
        /// The cap on a token's largest magnitude (0: none).
        upper_bound: f32,
        /// The static scale (0: dynamic).
        static_scale: f32,
        /// The E4M3 codes, [tokens, intermediate].
        xq: DevicePtr<E4m3>,
        /// The codes times their scales in bf16, [tokens, intermediate].
        xd: DevicePtr<Bf16>,
        /// The scales, [tokens, groups].
        scales: DevicePtr<f32>,
    }

    /// The arguments of `fp8_scale_output` (`kernels/fp8.cu`).
    Fp8ScaleOutput for &["fp8_scale_output"] => {
        /// The product of the codes, [m, n] fp32, scaled in place.
        out: DevicePtr<f32>,
        /// The input's scales, [m].
        x_scales: DevicePtr<f32>,
        /// The weights' scales, [n].
        w_scales: DevicePtr<f32>,
        /// Rows.
        m: i32,
        /// Columns (a multiple of 4).
        n: i32,
    }

    /// The arguments of `fp8_dequantize_weight` (`kernels/fp8.cu`).
    Fp8DequantizeWeight for &["fp8_dequantize_weight"] => {
        /// The E4M3 weights, [n, k].
        w: DevicePtr<E4m3>,
        /// The weight scales, [n, groups].
        scales: DevicePtr<f32>,
        /// Rows.
        n: i32,
        /// Columns.
        k: i32,
        /// Scales per row.
        groups: i32,
        /// Columns per scale.
        group: i32,
        /// The widened weights, [n, k] bf16.
        out: DevicePtr<Bf16>,
    }
}

kernel_args! {
    /// The arguments of `qkv_rope_write_scaled` (`kernels/qkv_rope.cu`): `qkv_rope_write` of
    /// cuBLASLt's unscaled FP8 q/k/v product, its scales applied first.
    QkvRopeWriteScaled for &["qkv_rope_write_scaled"] => {
        /// The unscaled product of the codes, [tokens, (q heads + 2 kv heads) × head_dim].
        qkv: DevicePtr<f32>,
        /// The product's per-token input scales, [tokens].
        x_scales: DevicePtr<f32>,
        /// Its per-row weight scales, [(q heads + 2 kv heads) × head_dim].
        w_scales: DevicePtr<f32>,
        /// The q/k/v bias (`None` for models without one).
        bias: Option<DevicePtr<Bf16>>,
        /// The per-head RMSNorm weight of q (`None` for models without one).
        q_norm: Option<DevicePtr<Bf16>>,
        /// The per-head RMSNorm weight of k (`None` for models without one).
        k_norm: Option<DevicePtr<Bf16>>,
        /// The rotary frequencies, positions and slots, and where q, k and v go.
        writes: RopeWrites,
    }

    /// The arguments of `fp8_gemv_swiglu_m1` … `_m8` (`kernels/fp8.cu`): the gate/up product
    /// with SwiGLU applied.
    Fp8GemvSwiglu for &FP8_GEMV_SWIGLU_ENTRIES => {
        /// The input rows, [m, k] bf16.
        x: DevicePtr<Bf16>,
        /// The stacked gate and up E4M3 weights, [2 × intermediate, k].
        w: DevicePtr<E4m3>,
        /// The weight scales, [2 × intermediate, groups].
        scales: DevicePtr<f32>,
        /// `silu(gate) × up`, [m, intermediate] bf16.
        out: DevicePtr<Bf16>,
        /// The product's depth.
        k: i32,
        /// Scales per weight row.
        groups: i32,
        /// Columns per scale.
        group: i32,
        /// Warps of a row group splitting K (`fp8::GemvGeometry::splits`).
        splits: i32,
    }

    /// The arguments of `fp8_gemv_qkv_rope_m1` … `_m8` (`kernels/fp8.cu`): the q/k/v product
    /// with the bias, the rotary embedding and the writes of q and the cache slots applied.
    Fp8GemvQkvRope for &FP8_GEMV_QKV_ROPE_ENTRIES => {
        /// The input rows, [m, k] bf16.
        x: DevicePtr<Bf16>,
        /// The stacked q, k and v E4M3 weights.
        w: DevicePtr<E4m3>,
        /// The weight scales, [rows, groups].
        scales: DevicePtr<f32>,
        /// The q/k/v bias (`None` for models without one).
        bias: Option<DevicePtr<Bf16>>,
        /// The rotary frequencies, positions and slots, and where q, k and v go.
        writes: RopeWrites,
        /// The product's depth.
        k: i32,
        /// Scales per weight row.
        groups: i32,
        /// Columns per scale.
        group: i32,
        /// Warps of a row group splitting K (`fp8::GemvGeometry::splits`).
        splits: i32,
    }
}
