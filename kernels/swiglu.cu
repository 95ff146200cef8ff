// SwiGLU activation: out[t, i] = silu(gate[t, i]) * up[t, i].
//
// Input: the fused gate/up GEMM output, [T, 2 * INTERMEDIATE] fp32 with the gate half first.
// Output: [T, INTERMEDIATE] bf16. Grid: (ceil(INTERMEDIATE / SWIGLU_VEC / blockDim.x), T); each
// thread computes SWIGLU_VEC consecutive elements of its row. SWIGLU_VEC comes from the host
// (src/backend/cuda/plan.rs): 4 when INTERMEDIATE is a multiple of 4 (16-byte loads of the gate
// and up values, one 8-byte store: the kernel is a pure stream of bytes), else 1. Where the
// small-M product serves the gate/up product, it applies SwiGLU itself (gemv_swiglu_mM,
// kernels/gemv.cu) and this kernel does not run.

extern "C" __global__ void swiglu(const float* __restrict__ gate_up, bf16* __restrict__ out) {
    await_previous_kernels();
    const int t = blockIdx.y;
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * SWIGLU_VEC;
    if (i >= INTERMEDIATE) return;
    const float* row = gate_up + (size_t)t * 2 * INTERMEDIATE;
    bf16* dst = out + (size_t)t * INTERMEDIATE + i;
#if SWIGLU_VEC == 4
    const float4 g = *reinterpret_cast<const float4*>(row + i);
    const float4 u = *reinterpret_cast<const float4*>(row + INTERMEDIATE + i);
    uint2 packed;
    packed.x = (unsigned int)f32_to_bf16(silu_times(g.x, u.x)) | ((unsigned int)f32_to_bf16(silu_times(g.y, u.y)) << 16);
    packed.y = (unsigned int)f32_to_bf16(silu_times(g.z, u.z)) | ((unsigned int)f32_to_bf16(silu_times(g.w, u.w)) << 16);
    *reinterpret_cast<uint2*>(dst) = packed;
#else
    dst[0] = f32_to_bf16(silu_times(row[i], row[INTERMEDIATE + i]));
#endif
}
