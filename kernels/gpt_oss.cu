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
// gptoss_gate_up_mxfp4 and gptoss_down_mxfp4 are the two products over experts kept in MXFP4 on
// the device, as the checkpoint stores them: per row, 16-byte blocks of 32 E2M1 values (the low
// nibble the even element) and one E8M0 scale per block (2^(byte - 127)); a lane takes a whole
// block at a time (one 16-byte load and one scale byte for 32 weights), widens the codes to
// floats in registers and applies the scale once per block. Their rows are then multiples of 32
// (the host keeps other shapes in bf16).
// Each slot reads its expert's rows whole, 16 bytes per lane: correct at any step size, the
// weights read once per slot (grouping the slots by expert, as kernels/moe.cu does, is the next
// step for prefill).

#define GO_WARPS 4
// MXFP4 bytes: two E2M1 codes (blocks), and one E8M0 scale.
typedef unsigned char e2m1x2;
typedef unsigned char e8m0;
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

// The value of E2M1 code `c` (sign bit 3, exponent bits 2-1, mantissa bit 0; exponent 0 is
// subnormal: 0 or 0.5), built as float bits.
__device__ __forceinline__ float go_e2m1(unsigned int c) {
    const unsigned int e = (c >> 1) & 3u;
    const unsigned int m = c & 1u;
    const unsigned int bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | ((c & 8u) << 28));
}

// The value of E8M0 scale byte `s`, 2^(s - 127) (0x00: the subnormal 2^-127; 0xFF, NaN, is
// refused by the host at load).
__device__ __forceinline__ float go_e8m0(unsigned int s) {
    return s ? __uint_as_float(s << 23) : __uint_as_float(0x00400000u);
}

// The dot product of `n` bf16 values of `x` (n a multiple of 32, 16-byte aligned) with one MXFP4
// row (`blocks`: n / 2 bytes, `scales`: n / 32 bytes), summed over the warp.
__device__ __forceinline__ float go_warp_dot_mxfp4(const bf16* __restrict__ x, const unsigned char* __restrict__ blocks,
                                                   const unsigned char* __restrict__ scales, int n) {
    const int lane = threadIdx.x & 31;
    float sum = 0.0f;
    for (int b = lane; b < n / 32; b += 32) {
        const uint4 packed = __ldg(reinterpret_cast<const uint4*>(blocks + 16 * b));
        const unsigned int words[4] = {packed.x, packed.y, packed.z, packed.w};
        float part = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            float xv[8];
            go_unpack8(*reinterpret_cast<const uint4*>(x + 32 * b + 8 * w), xv);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned int byte = words[w] >> (8 * i);
                part = fmaf(xv[2 * i], go_e2m1(byte & 15u), part);
                part = fmaf(xv[2 * i + 1], go_e2m1((byte >> 4) & 15u), part);
            }
        }
        sum = fmaf(part, go_e8m0(__ldg(scales + b)), sum);
    }
    return warp_sum(sum);
}

// Row `row` of an expert matrix `n` wide: bf16 values (MX false: `w` is bf16 [rows, n]) or MXFP4
// (MX true: `w` the blocks [rows, n / 2] bytes, `scales` [rows, n / 32]), dotted with `x`.
template <bool MX>
__device__ __forceinline__ float go_row_dot(const bf16* __restrict__ x, const void* __restrict__ w,
                                            const unsigned char* __restrict__ scales, size_t row, int n) {
    if (MX) {
        return go_warp_dot_mxfp4(x, static_cast<const unsigned char*>(w) + row * (size_t)(n / 2),
                                 scales + row * (size_t)(n / 32), n);
    }
    return go_warp_dot(x, static_cast<const bf16*>(w) + row * (size_t)n, n);
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

// gptoss_gate_up's body over bf16 (MX false) or MXFP4 (MX true) experts.
template <bool MX>
__device__ __forceinline__ void go_gate_up(const bf16* __restrict__ x, const void* __restrict__ w,
                                           const unsigned char* __restrict__ scales, const bf16* __restrict__ bias,
                                           const int* __restrict__ topk_ids, bf16* __restrict__ act) {
    await_previous_kernels();
    const int slot = blockIdx.x;
    const int i = blockIdx.y * GO_WARPS + (threadIdx.x >> 5);
    if (i >= MOE_INTER) return;
    const int e = topk_ids[slot];
    const bf16* row = x + (size_t)(slot / MOE_TOP_K) * HIDDEN;
    const size_t gate_row = (size_t)e * 2 * MOE_INTER + 2 * i;
    float gate = go_row_dot<MX>(row, w, scales, gate_row, HIDDEN);
    float up = go_row_dot<MX>(row, w, scales, gate_row + 1, HIDDEN);
    if ((threadIdx.x & 31) != 0) return;
    gate = fminf(gate + bf16_to_f32(bias[(size_t)e * 2 * MOE_INTER + 2 * i]), GPTOSS_LIMIT);
    up = fminf(fmaxf(up + bf16_to_f32(bias[(size_t)e * 2 * MOE_INTER + 2 * i + 1]), -GPTOSS_LIMIT), GPTOSS_LIMIT);
    const float glu = gate * (1.0f / (1.0f + expf(-(gate * GPTOSS_ALPHA))));
    act[(size_t)slot * MOE_INTER + i] = f32_to_bf16((up + 1.0f) * glu);
}

// gptoss_down's body over bf16 (MX false) or MXFP4 (MX true) experts.
template <bool MX>
__device__ __forceinline__ void go_down(const bf16* __restrict__ act, const void* __restrict__ w,
                                        const unsigned char* __restrict__ scales, const bf16* __restrict__ bias,
                                        const int* __restrict__ topk_ids, float* __restrict__ y) {
    await_previous_kernels();
    const int slot = blockIdx.x;
    const int h = blockIdx.y * GO_WARPS + (threadIdx.x >> 5);
    if (h >= HIDDEN) return;
    const int e = topk_ids[slot];
    const float dot = go_row_dot<MX>(act + (size_t)slot * MOE_INTER, w, scales, (size_t)e * HIDDEN + h, MOE_INTER);
    if ((threadIdx.x & 31) == 0) y[(size_t)slot * HIDDEN + h] = dot + bf16_to_f32(bias[(size_t)e * HIDDEN + h]);
}

extern "C" __global__ void __launch_bounds__(GO_WARPS * 32)
gptoss_gate_up(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ bias,
               const int* __restrict__ topk_ids, bf16* __restrict__ act) {
    go_gate_up<false>(x, w, nullptr, bias, topk_ids, act);
}

extern "C" __global__ void __launch_bounds__(GO_WARPS * 32)
gptoss_gate_up_mxfp4(const bf16* __restrict__ x, const e2m1x2* __restrict__ blocks,
                     const e8m0* __restrict__ scales, const bf16* __restrict__ bias,
                     const int* __restrict__ topk_ids, bf16* __restrict__ act) {
    go_gate_up<true>(x, blocks, scales, bias, topk_ids, act);
}

extern "C" __global__ void __launch_bounds__(GO_WARPS * 32)
gptoss_down(const bf16* __restrict__ act, const bf16* __restrict__ w, const bf16* __restrict__ bias,
            const int* __restrict__ topk_ids, float* __restrict__ y) {
    go_down<false>(act, w, nullptr, bias, topk_ids, y);
}

extern "C" __global__ void __launch_bounds__(GO_WARPS * 32)
gptoss_down_mxfp4(const bf16* __restrict__ act, const e2m1x2* __restrict__ blocks,
                  const e8m0* __restrict__ scales, const bf16* __restrict__ bias,
                  const int* __restrict__ topk_ids, float* __restrict__ y) {
    go_down<true>(act, blocks, scales, bias, topk_ids, y);
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
