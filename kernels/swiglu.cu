// SwiGLU activation: out[t, i] = silu(gate[t, i]) * up[t, i].
//
// Input: the fused gate/up GEMM output, [T, 2 * INTERMEDIATE] fp32 with the gate half first.
// Output: [T, INTERMEDIATE] bf16. Grid: (ceil(INTERMEDIATE / blockDim.x), T).

extern "C" __global__ void swiglu(const float* __restrict__ gate_up, bf16* __restrict__ out) {
    await_previous_kernels();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= INTERMEDIATE) return;
    const float* row = gate_up + (size_t)t * 2 * INTERMEDIATE;
    const float g = row[i];
    const float u = row[INTERMEDIATE + i];
    const float silu = g / (1.0f + expf(-g));
    out[(size_t)t * INTERMEDIATE + i] = f32_to_bf16(silu * u);
}
