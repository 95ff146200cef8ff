// Greedy sampling and log-probabilities on the GPU.
//
// One block (1024 threads) per sampled row of logits [S, VOCAB] fp32. The row's token is the
// argmax (the lower id wins ties, as in the engine's reference sampler), its logprob is
// logit - logsumexp(logits) over the raw logits, and top_n[s] alternatives follow in the order
// (logprob descending, id ascending). Everything the host needs lands in one int32 buffer, so a
// step ends with a single device-to-host copy. Per row, SAMPLE_STRIDE words:
//   [0] token id, [1] logprob (float bits), then per alternative k: [2 + 2k] id, [3 + 2k] logprob.

#define SAMPLE_STRIDE (2 + 2 * MAX_TOP_LOGPROBS)

// Whether (v, i) comes before (bv, bi) in the order value descending, id ascending.
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The first (value, id) pair in rank order over the row that ranks strictly after (after_v,
// after_i). Every thread receives it.
__device__ void block_argmax_after(const float* __restrict__ row, float after_v, int after_i,
                                   float* sv, int* si, float* out_v, int* out_i) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < VOCAB; i += blockDim.x) {
        const float v = row[i];
        if (v != v) continue;
        if (ranks_before(after_v, after_i, v, i) && ranks_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ranks_before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    bv = sv[0];
    bi = si[0];
    const int warps = (blockDim.x + 31) >> 5;
    for (int w = 1; w < warps; ++w) {
        if (ranks_before(sv[w], si[w], bv, bi)) {
            bv = sv[w];
            bi = si[w];
        }
    }
    __syncthreads();
    *out_v = bv;
    *out_i = bi;
}

extern "C" __global__ void __launch_bounds__(1024)
sample_greedy(const float* __restrict__ logits, const int* __restrict__ top_n,
              int* __restrict__ out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int s = blockIdx.x;
    const float* row = logits + (size_t)s * VOCAB;
    int* dst = out + (size_t)s * SAMPLE_STRIDE;

    float best_v;
    int best_i;
    block_argmax_after(row, INFINITY, -1, sv, si, &best_v, &best_i);

    float sum = 0.0f;
    for (int i = threadIdx.x; i < VOCAB; i += blockDim.x) {
        const float v = row[i];
        if (v == v) sum += expf(v - best_v);
    }
    const float lse = best_v + logf(block_sum(sum, sv));

    if (threadIdx.x == 0) {
        dst[0] = best_i;
        dst[1] = __float_as_int(best_v - lse);
    }
    const int n = min(top_n[s], MAX_TOP_LOGPROBS);
    float prev_v = INFINITY;
    int prev_i = -1;
    for (int k = 0; k < n; ++k) {
        float v;
        int i;
        block_argmax_after(row, prev_v, prev_i, sv, si, &v, &i);
        if (threadIdx.x == 0) {
            dst[2 + 2 * k] = i;
            dst[3 + 2 * k] = __float_as_int(v - lse);
        }
        prev_v = v;
        prev_i = i;
    }
}
