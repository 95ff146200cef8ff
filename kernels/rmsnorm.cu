// Fused residual add + RMSNorm.
//
// residual[r] += delta[r] (fp32, when delta is not null), then out[o] = bf16(residual[r] * rsqrt(mean(
// residual[r]^2) + RMS_EPS) * weight). The residual stream stays fp32 across layers; the normed
// activations feed the next GEMM in bf16.
//
// `rows` (optional) selects which residual rows to process: block o handles row rows[o] and
// writes output row o. The final norm uses it to normalise only the rows whose logits are needed.
// Grid: one block per output row. Block: RMS_THREADS threads (from the host, plan.rs: a
// batch-1 row is latency-bound with fewer). Each thread keeps its RMS_SLOTS values of the row and
// of the weight in registers, so the row is read once; the weight, which no kernel writes, is
// read before waiting for the kernel that wrote the residual.

#define RMS_SLOTS ((HIDDEN + RMS_THREADS - 1) / RMS_THREADS)

extern "C" __global__ void __launch_bounds__(RMS_THREADS) add_rmsnorm(float* __restrict__ residual,
                                                                     const float* __restrict__ delta,
                                                                     const bf16* __restrict__ weight,
                                                                     const int* __restrict__ rows,
                                                                     bf16* __restrict__ out) {
    float w[RMS_SLOTS];
#pragma unroll
    for (int k = 0; k < RMS_SLOTS; ++k) {
        const int i = threadIdx.x + k * RMS_THREADS;
        w[k] = i < HIDDEN ? bf16_to_f32(weight[i]) : 0.0f;
    }
    await_previous_kernels();
    __shared__ float scratch[32];
    const int o = blockIdx.x;
    const int r = rows ? rows[o] : o;
    float* x = residual + (size_t)r * HIDDEN;
    float v[RMS_SLOTS];
    float sumsq = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_SLOTS; ++k) {
        const int i = threadIdx.x + k * RMS_THREADS;
        v[k] = 0.0f;
        if (i < HIDDEN) {
            v[k] = x[i];
            if (delta) {
                v[k] += delta[(size_t)r * HIDDEN + i];
                x[i] = v[k];
            }
        }
        sumsq += v[k] * v[k];
    }
    const float inv = rsqrtf(block_sum(sumsq, scratch) / (float)HIDDEN + RMS_EPS);
    bf16* y = out + (size_t)o * HIDDEN;
#pragma unroll
    for (int k = 0; k < RMS_SLOTS; ++k) {
        const int i = threadIdx.x + k * RMS_THREADS;
        if (i < HIDDEN) y[i] = f32_to_bf16(v[k] * inv * w[k]);
    }
}
