// QKV post-processing, fused with the write into the paged KV cache.
//
// Input: the fused QKV GEMM output, [T, (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM] fp32, with
// all query heads first, then key heads, then value heads. Per head, in order:
//   1. add the projection bias (QKV_BIAS, Qwen2);
//   2. per-head RMSNorm of q and k (QK_NORM, Qwen3);
//   3. rotary embedding of q and k in the "rotate half" layout, angle = position * inv_freq[i]
//      (inv_freq comes from the host with any llama3/linear scaling already applied);
//   4. q goes to q_out [T, NUM_Q_HEADS, HEAD_DIM]; k and v go to cache slot slots[t] of their KV
//      head. slots[t] < 0 marks a padding token: nothing is written.
// Cache layout per layer: [num_blocks * KV_BLOCK slots][NUM_KV_HEADS][HEAD_DIM] kv_t: bf16, or
// with KV_FP8 E4M3 bytes of the value over the layer's scale (kv_scales: k then v).
// Grid: one block per token. Block: QKV_WARPS warps; warp w handles heads w, w + QKV_WARPS, ...
// qkv_rope_write_scaled first applies the scales of an FP8 product left unscaled (see qkv_rope).
// Where the small-M product serves the q/k/v product of a model without QK_NORM, it does steps 1,
// 3 and 4 on its own output (gemv_qkv_rope_mM, kernels/gemv.cu) and this kernel does not run.

#define QKV_HEADS (NUM_Q_HEADS + 2 * NUM_KV_HEADS)
#define QKV_PAIRS (HEAD_DIM / 2)
#define QKV_PER_LANE ((QKV_PAIRS + 31) / 32)

// The work above; with w_scales (qkv_rope_write_scaled), qkv is cuBLASLt's unscaled FP8 product
// of E4M3 codes (kernels/fp8.cu) and each value is first scaled by its token's input scale
// (x_scales) and its row's weight scale, rounded as fp8_scale_output rounds (no fused
// multiply-add), so that pass does not run.
__device__ __forceinline__ void qkv_rope(const float* __restrict__ qkv,
                                         const float* __restrict__ x_scales,
                                         const float* __restrict__ w_scales,
                                         const bf16* __restrict__ bias,
                                         const bf16* __restrict__ q_norm,
                                         const bf16* __restrict__ k_norm,
                                         const float* __restrict__ inv_freq,
                                         const int* __restrict__ positions,
                                         const int* __restrict__ slots,
                                         bf16* __restrict__ q_out,
                                         kv_t* __restrict__ k_cache,
                                         kv_t* __restrict__ v_cache,
                                         const float* __restrict__ kv_scales) {
    await_previous_kernels();
    const int t = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const int slot = slots[t];
    const float pos = (float)positions[t];
    const float* row = qkv + (size_t)t * QKV_HEADS * HEAD_DIM;

    for (int h = warp; h < QKV_HEADS; h += warps) {
        const bool is_q = h < NUM_Q_HEADS;
        const bool is_v = h >= NUM_Q_HEADS + NUM_KV_HEADS;
        if (!is_q && slot < 0) continue;
        const float* x = row + h * HEAD_DIM;
        float a[QKV_PER_LANE];
        float b[QKV_PER_LANE];
        float sumsq = 0.0f;
#pragma unroll
        for (int k = 0; k < QKV_PER_LANE; ++k) {
            const int i = lane + 32 * k;
            a[k] = 0.0f;
            b[k] = 0.0f;
            if (i < QKV_PAIRS) {
                a[k] = x[i];
                b[k] = x[i + QKV_PAIRS];
                if (w_scales) {
                    const float sx = x_scales[t];
                    a[k] = __fmul_rn(a[k], __fmul_rn(sx, w_scales[h * HEAD_DIM + i]));
                    b[k] = __fmul_rn(b[k], __fmul_rn(sx, w_scales[h * HEAD_DIM + i + QKV_PAIRS]));
                }
#if QKV_BIAS
                a[k] += bf16_to_f32(bias[h * HEAD_DIM + i]);
                b[k] += bf16_to_f32(bias[h * HEAD_DIM + i + QKV_PAIRS]);
#endif
                sumsq += a[k] * a[k] + b[k] * b[k];
            }
        }
#if QK_NORM
        if (!is_v) {
            const bf16* w = is_q ? q_norm : k_norm;
            const float inv = rsqrtf(warp_sum(sumsq) / (float)HEAD_DIM + RMS_EPS);
#pragma unroll
            for (int k = 0; k < QKV_PER_LANE; ++k) {
                const int i = lane + 32 * k;
                if (i < QKV_PAIRS) {
                    a[k] = a[k] * inv * bf16_to_f32(w[i]);
                    b[k] = b[k] * inv * bf16_to_f32(w[i + QKV_PAIRS]);
                }
            }
        }
#endif
#if KV_FP8
#pragma unroll
        for (int k = 0; k < QKV_PER_LANE; ++k) {
            const int i = lane + 32 * k;
            if (i < QKV_PAIRS) {
                float lo = a[k];
                float hi = b[k];
                if (!is_v) rotate_pair(pos * inv_freq[i], lo, hi);
                qkv_store(h, t, slot, i, lo, hi, q_out, k_cache, v_cache, kv_scales);
            }
        }
#else
        bf16* dst = qkv_destination(h, t, slot, q_out, k_cache, v_cache);
#pragma unroll
        for (int k = 0; k < QKV_PER_LANE; ++k) {
            const int i = lane + 32 * k;
            if (i < QKV_PAIRS) {
                float lo = a[k];
                float hi = b[k];
                if (!is_v) rotate_pair(pos * inv_freq[i], lo, hi);
                dst[i] = f32_to_bf16(lo);
                dst[i + QKV_PAIRS] = f32_to_bf16(hi);
            }
        }
#endif
    }
}

extern "C" __global__ void qkv_rope_write(const float* __restrict__ qkv,
                                          const bf16* __restrict__ bias,
                                          const bf16* __restrict__ q_norm,
                                          const bf16* __restrict__ k_norm,
                                          const float* __restrict__ inv_freq,
                                          const int* __restrict__ positions,
                                          const int* __restrict__ slots,
                                          bf16* __restrict__ q_out,
                                          kv_t* __restrict__ k_cache,
                                          kv_t* __restrict__ v_cache,
                                          const float* __restrict__ kv_scales) {
    qkv_rope(qkv, nullptr, nullptr, bias, q_norm, k_norm, inv_freq, positions, slots, q_out, k_cache, v_cache, kv_scales);
}

extern "C" __global__ void qkv_rope_write_scaled(const float* __restrict__ qkv,
                                                 const float* __restrict__ x_scales,
                                                 const float* __restrict__ w_scales,
                                                 const bf16* __restrict__ bias,
                                                 const bf16* __restrict__ q_norm,
                                                 const bf16* __restrict__ k_norm,
                                                 const float* __restrict__ inv_freq,
                                                 const int* __restrict__ positions,
                                                 const int* __restrict__ slots,
                                                 bf16* __restrict__ q_out,
                                                 kv_t* __restrict__ k_cache,
                                                 kv_t* __restrict__ v_cache,
                                                 const float* __restrict__ kv_scales) {
    qkv_rope(qkv, x_scales, w_scales, bias, q_norm, k_norm, inv_freq, positions, slots, q_out, k_cache, v_cache,
             kv_scales);
}
