// gpt-oss's mixture of experts (src/backend/cuda/backend/gpt_oss.rs), compiled only for a model
// whose experts are gpt-oss's. The host defines, beside the model's shapes: MOE_EXPERTS,
// MOE_TOP_K, MOE_INTER (each expert's width), GPTOSS_ALPHA and GPTOSS_LIMIT (the clamped SwiGLU's
// slope and clamp). HIDDEN and MOE_INTER are multiples of 8 (the host refuses others).
//
// A step of T tokens runs, after the router's product (logits [T, MOE_EXPERTS] fp32, no bias):
//   gptoss_route     per token, one warp: the router bias added, the top k logits by k rounds of a
//                    warp arg-max (ties: the lower expert), then a softmax over those k alone;
//                    [T, MOE_TOP_K] expert ids and weights;
//   gptoss_gate_up   grid (T * MOE_TOP_K slots, MOE_INTER / GO_WARPS): one warp per pair of gate
//                    and up rows (interleaved: feature 2i gate, 2i + 1 up) of the slot's expert,
//                    biases added, then (clamp(up, +-limit) + 1) * g * sigmoid(alpha * g) with
//                    g = min(gate, limit), [T * MOE_TOP_K, MOE_INTER] bf16;
//   gptoss_down      grid (slots, HIDDEN / GO_WARPS): one warp per output row of the slot's
//                    expert's down projection, its bias added, [T * MOE_TOP_K, HIDDEN] fp32;
//   gptoss_combine   per token, the weighted sum of its slots' rows in expert order (the order
//                    in which the CPU reference adds them), into `delta`;
//   gptoss_add_bias  the output projection's bias added to `delta` (before the norm adds it to
//                    the residual stream).
// Each slot reads its expert's rows whole, 16 bytes per lane: correct at any step size, the
// weights read once per slot (grouping the slots by expert, as kernels/moe.cu does, is left to
// the MXFP4 products).

#define GO_WARPS 4
#define GO_PER_LANE ((MOE_EXPERTS + 31) / 32)

// Eight bf16 values packed in a 16-byte word, widened.
__device__ __forceinline__ void go_unpack8(uint4 w, float* out) {
    const unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// The dot product of `n` bf16 values (n a multiple of 8, 16-byte aligned) of `a` and `b`, summed
// over the warp.
__device__ __forceinline__ float go_warp_dot(const bf16* __restrict__ a, const bf16* __restrict__ b, int n) {
    const int lane = threadIdx.x & 31;
    float sum = 0.0f;
    for (int c = lane; c < n / 8; c += 32) {
        float x[8], y[8];
        go_unpack8(*reinterpret_cast<const uint4*>(a + 8 * c), x);
        go_unpack8(__ldg(reinterpret_cast<const uint4*>(b + 8 * c)), y);
#pragma unroll
        for (int i = 0; i < 8; ++i) sum = fmaf(x[i], y[i], sum);
    }
    return warp_sum(sum);
}

extern "C" __global__ void __launch_bounds__(GO_WARPS * 32)
gptoss_route(const float* __restrict__ logits, const bf16* __restrict__ bias, int* __restrict__ topk_ids,
             float* __restrict__ topk_weights, int count) {
    await_previous_kernels();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * GO_WARPS + (threadIdx.x >> 5);
    if (t >= count) return;
    float v[GO_PER_LANE];
#pragma unroll
    for (int j = 0; j < GO_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        v[j] = e < MOE_EXPERTS ? logits[(size_t)t * MOE_EXPERTS + e] + bf16_to_f32(bias[e]) : -INFINITY;
    }
    unsigned int taken = 0;  // this lane's chosen experts, bit j for expert lane + 32 j
    int ids[MOE_TOP_K];
    float top[MOE_TOP_K];
#pragma unroll
    for (int k = 0; k < MOE_TOP_K; ++k) {
        float best = -INFINITY;
        int best_e = MOE_EXPERTS;  // none yet
#pragma unroll
        for (int j = 0; j < GO_PER_LANE; ++j) {
            const int e = lane + 32 * j;
            if (e < MOE_EXPERTS && !(taken >> j & 1u) && (best_e == MOE_EXPERTS || v[j] > best)) {
                best = v[j];
                best_e = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, o);
            const int other_e = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (other_e != MOE_EXPERTS && (best_e == MOE_EXPERTS || other > best || (other == best && other_e < best_e))) {
                best = other;
                best_e = other_e;
            }
        }
        ids[k] = best_e;
        top[k] = best;
        if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
    }
    if (lane != 0) return;
    // Softmax over the k chosen logits (the first is the largest).
    float w[MOE_TOP_K];
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < MOE_TOP_K; ++k) total += (w[k] = expf(top[k] - top[0]));
#pragma unroll
    for (int k = 0; k < MOE_TOP_K; ++k) {
        topk_ids[(size_t)t * MOE_TOP_K + k] = ids[k];
        topk_weights[(size_t)t * MOE_TOP_K + k] = w[k] / total;
    }
}

extern "C" __global__ void __launch_bounds__(GO_WARPS * 32)
gptoss_gate_up(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
               const int* __restrict__ topk_ids, bf16* __restrict__ act) {
    await_previous_kernels();
    const int slot = blockIdx.x;
    const int i = blockIdx.y * GO_WARPS + (threadIdx.x >> 5);
    if (i >= MOE_INTER) return;
    const int e = topk_ids[slot];
    const bf16* row = x + (size_t)(slot / MOE_TOP_K) * HIDDEN;
    const bf16* gate_w = w + ((size_t)e * 2 * MOE_INTER + 2 * i) * HIDDEN;
    float gate = go_warp_dot(row, gate_w, HIDDEN);
    float up = go_warp_dot(row, gate_w + HIDDEN, HIDDEN);
    if ((threadIdx.x & 31) != 0) return;
    gate = fminf(gate + bf16_to_f32(bias[(size_t)e * 2 * MOE_INTER + 2 * i]), GPTOSS_LIMIT);
    up = fminf(fmaxf(up + bf16_to_f32(bias[(size_t)e * 2 * MOE_INTER + 2 * i + 1]), -GPTOSS_LIMIT), GPTOSS_LIMIT);
    const float glu = gate * (1.0f / (1.0f + expf(-(gate * GPTOSS_ALPHA))));
    act[(size_t)slot * MOE_INTER + i] = f32_to_bf16((up + 1.0f) * glu);
}

extern "C" __global__ void __launch_bounds__(GO_WARPS * 32)
gptoss_down(const bf16* __restrict__ act, const bf16* __restrict__ w, const bf16* __restrict__ bias,
            const int* __restrict__ topk_ids, float* __restrict__ y) {
    await_previous_kernels();
    const int slot = blockIdx.x;
    const int h = blockIdx.y * GO_WARPS + (threadIdx.x >> 5);
    if (h >= HIDDEN) return;
    const int e = topk_ids[slot];
    const float dot = go_warp_dot(act + (size_t)slot * MOE_INTER, w + ((size_t)e * HIDDEN + h) * MOE_INTER, MOE_INTER);
    if ((threadIdx.x & 31) == 0) y[(size_t)slot * HIDDEN + h] = dot + bf16_to_f32(bias[(size_t)e * HIDDEN + h]);
}

extern "C" __global__ void gptoss_combine(const float* __restrict__ y, const int* __restrict__ topk_ids,
                                          const float* __restrict__ topk_weights, float* __restrict__ delta) {
    await_previous_kernels();
    const int t = blockIdx.x;
    // The token's slots in expert order.
    int order[MOE_TOP_K];
#pragma unroll
    for (int k = 0; k < MOE_TOP_K; ++k) order[k] = k;
#pragma unroll
    for (int k = 1; k < MOE_TOP_K; ++k) {
        for (int j = k; j > 0 && topk_ids[t * MOE_TOP_K + order[j - 1]] > topk_ids[t * MOE_TOP_K + order[j]]; --j) {
            const int swap = order[j];
            order[j] = order[j - 1];
            order[j - 1] = swap;
        }
    }
    for (int h = threadIdx.x; h < HIDDEN; h += blockDim.x) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < MOE_TOP_K; ++k) {
            const size_t slot = (size_t)t * MOE_TOP_K + order[k];
            sum += y[slot * HIDDEN + h] * topk_weights[slot];
        }
        delta[(size_t)t * HIDDEN + h] = sum;
    }
}

extern "C" __global__ void gptoss_add_bias(float* __restrict__ delta, const bf16* __restrict__ bias) {
    await_previous_kernels();
    for (int h = threadIdx.x; h < HIDDEN; h += blockDim.x) delta[(size_t)blockIdx.x * HIDDEN + h] += bf16_to_f32(bias[h]);
}
