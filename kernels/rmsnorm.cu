// Fused residual add + RMSNorm.
//
// residual[r] += delta[r] (fp32, when delta is not null), then out[o] = bf16(residual[r] * rsqrt(mean(
// residual[r]^2) + RMS_EPS) * weight). The residual stream stays fp32 across layers; the normed
// activations feed the next GEMM in bf16.
//
// `rows` (optional) selects which residual rows to process: block o handles row rows[o] and
// writes output row o. The final norm uses it to normalise only the rows whose logits are needed.
// Grid: one block per output row. Block: any multiple of 32 up to 1024 threads (the backend
// launches 1024: a batch-1 row is latency-bound with fewer).

extern "C" __global__ void add_rmsnorm(float* __restrict__ residual,
                                       const float* __restrict__ delta,
                                       const bf16* __restrict__ weight,
                                       const int* __restrict__ rows,
                                       bf16* __restrict__ out) {
    await_previous_kernels();
    __shared__ float scratch[32];
    const int o = blockIdx.x;
    const int r = rows ? rows[o] : o;
    float* x = residual + (size_t)r * HIDDEN;
    float sumsq = 0.0f;
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) {
        float v = x[i];
        if (delta) {
            v += delta[(size_t)r * HIDDEN + i];
            x[i] = v;
        }
        sumsq += v * v;
    }
    const float inv = rsqrtf(block_sum(sumsq, scratch) / (float)HIDDEN + RMS_EPS);
    bf16* y = out + (size_t)o * HIDDEN;
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) {
        y[i] = f32_to_bf16(x[i] * inv * bf16_to_f32(weight[i]));
    }
}
