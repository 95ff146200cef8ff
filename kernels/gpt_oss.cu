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
// Each slot reads its expert's rows whole, 16 bytes per lane: the weights read once per slot,
// which suits decode. For many rows per expert (prefill) the slots are grouped by expert instead,
// with kernels/moe.cu's permutation and tensor-core tile (compiled before this file with its entry
// points left out, MOE_NO_ENTRIES; its mx_e2m1 and mx_e8m0 widen MXFP4 here too):
//   gptoss_permute   moe_permute's block: the (token, slot) pairs grouped by expert (`meta`,
//                    `sorted_tokens`, `row_of`);
//   gptoss_gather    the permuted rows of x;
//   gptoss_gemm_gate_up(_mxfp4)  each expert's segment in 64-row tiles against its interleaved
//                    gate/up rows (bf16, or MXFP4 widened exactly to bf16 as the tile is loaded),
//                    biases and the clamped SwiGLU in the epilogue, [rows, MOE_INTER] bf16;
//   gptoss_gemm_down(_mxfp4)  the same for the down projection with its bias, [rows, HIDDEN] fp32;
//   gptoss_combine   with `row_of`, each slot's output read from its permuted row.

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

// One MXFP4 row `N` wide (N a multiple of 32) as a warp holds it: lane l keeps the row's blocks
// l, l + 32, ... (16 bytes of codes and the scale byte each). The loads of a row, and of the
// gate/up pair, are all issued before any product, so a warp has every load of its rows in
// flight at once rather than one block's at a time (a 2880-wide row is 90 blocks: 3 per lane).
template <int N>
struct GoMxRow {
    static constexpr int BLOCKS = N / 32;
    static constexpr int PER_LANE = (BLOCKS + 31) / 32;
    uint4 codes[PER_LANE];
    unsigned char scale[PER_LANE];

    // Row `row` of an MXFP4 expert matrix N wide (`matrix` [rows, N / 2] bytes, `all_scales`
    // [rows, N / 32]).
    __device__ __forceinline__ void load(const void* __restrict__ matrix, const unsigned char* __restrict__ all_scales,
                                         size_t row) {
        const unsigned char* blocks = static_cast<const unsigned char*>(matrix) + row * (size_t)(N / 2);
        const unsigned char* scales = all_scales + row * (size_t)(N / 32);
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int b = lane + 32 * j;
            if (b < BLOCKS) {
                codes[j] = __ldg(reinterpret_cast<const uint4*>(blocks + 16 * b));
                scale[j] = __ldg(scales + b);
            }
        }
    }

    // The row dotted with N bf16 values of `x` (16-byte aligned), summed over the warp: per
    // lane, each block's 32 products summed, then times its scale, in block order.
    __device__ __forceinline__ float dot(const bf16* __restrict__ x) const {
        const int lane = threadIdx.x & 31;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            const int b = lane + 32 * j;
            if (b >= BLOCKS) break;
            const unsigned int words[4] = {codes[j].x, codes[j].y, codes[j].z, codes[j].w};
            float part = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                float xv[8];
                go_unpack8(*reinterpret_cast<const uint4*>(x + 32 * b + 8 * w), xv);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const unsigned int byte = words[w] >> (8 * i);
                    part = fmaf(xv[2 * i], mx_e2m1(byte & 15u), part);
                    part = fmaf(xv[2 * i + 1], mx_e2m1((byte >> 4) & 15u), part);
                }
            }
            sum = fmaf(part, mx_e8m0(scale[j]), sum);
        }
        return warp_sum(sum);
    }
};

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
    float gate, up;
    if constexpr (MX) {
        GoMxRow<HIDDEN> g, u;
        g.load(w, scales, gate_row);
        u.load(w, scales, gate_row + 1);
        gate = g.dot(row);
        up = u.dot(row);
    } else {
        gate = go_warp_dot(row, static_cast<const bf16*>(w) + gate_row * HIDDEN, HIDDEN);
        up = go_warp_dot(row, static_cast<const bf16*>(w) + (gate_row + 1) * HIDDEN, HIDDEN);
    }
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
    const bf16* x = act + (size_t)slot * MOE_INTER;
    float dot;
    if constexpr (MX) {
        GoMxRow<MOE_INTER> r;
        r.load(w, scales, (size_t)e * HIDDEN + h);
        dot = r.dot(x);
    } else {
        dot = go_warp_dot(x, static_cast<const bf16*>(w) + ((size_t)e * HIDDEN + h) * MOE_INTER, MOE_INTER);
    }
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

// The slots' outputs are y's rows slot (row_of null) or row_of[slot] (the grouped products').
extern "C" __global__ void gptoss_combine(const float* __restrict__ y, const int* __restrict__ row_of,
                                          const int* __restrict__ topk_ids, const float* __restrict__ topk_weights,
                                          float* __restrict__ delta) {
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
            const size_t row = row_of != nullptr ? (size_t)row_of[slot] : slot;
            sum += y[row * HIDDEN + h] * topk_weights[slot];
        }
        delta[(size_t)t * HIDDEN + h] = sum;
    }
}

extern "C" __global__ void gptoss_add_bias(float* __restrict__ delta, const bf16* __restrict__ bias) {
    await_previous_kernels();
    for (int h = threadIdx.x; h < HIDDEN; h += blockDim.x) delta[(size_t)blockIdx.x * HIDDEN + h] += bf16_to_f32(bias[h]);
}

// The grouped path's entries (see the file comment): the permutation by one block of 1024
// threads, the gather by a grid of blocks taking rows in turn, the tiles on grid (column blocks,
// row tiles of the step at most) of 128 threads, as kernels/moe.cu's.
extern "C" __global__ void __launch_bounds__(1024)
gptoss_permute(const int* __restrict__ topk_ids, int* __restrict__ meta, int* __restrict__ sorted_tokens,
               int* __restrict__ row_of, int count) {
    await_previous_kernels();
    moe_permute_block(topk_ids, meta, sorted_tokens, row_of, count * MOE_TOP_K);
}

extern "C" __global__ void gptoss_gather(const bf16* __restrict__ x, const int* __restrict__ sorted_tokens,
                                         bf16* __restrict__ x_perm, int count) {
    await_previous_kernels();
    moe_gather_rows(x, sorted_tokens, x_perm, blockIdx.x, gridDim.x, count * MOE_TOP_K);
}

extern "C" __global__ void __launch_bounds__(128)
gptoss_gemm_gate_up(const bf16* __restrict__ x_perm, const bf16* __restrict__ w, const bf16* __restrict__ bias,
                    const int* __restrict__ meta, bf16* __restrict__ act) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<true, MOE_B_BF16, true>(x_perm, HIDDEN, MoeTileWeights{w, nullptr, 1, 0, bias}, meta, act, MOE_INTER,
                                          HIDDEN);
#endif
}

extern "C" __global__ void __launch_bounds__(128)
gptoss_gemm_gate_up_mxfp4(const bf16* __restrict__ x_perm, const e2m1x2* __restrict__ blocks,
                          const e8m0* __restrict__ scales, const bf16* __restrict__ bias,
                          const int* __restrict__ meta, bf16* __restrict__ act) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<true, MOE_B_MXFP4, true>(x_perm, HIDDEN, MoeTileWeights{blocks, scales, 1, 0, bias}, meta, act,
                                           MOE_INTER, HIDDEN);
#endif
}

extern "C" __global__ void __launch_bounds__(128)
gptoss_gemm_down(const bf16* __restrict__ act, const bf16* __restrict__ w, const bf16* __restrict__ bias,
                 const int* __restrict__ meta, float* __restrict__ y) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<false, MOE_B_BF16, true>(act, MOE_INTER, MoeTileWeights{w, nullptr, 1, 0, bias}, meta, y, HIDDEN,
                                           MOE_INTER);
#endif
}

extern "C" __global__ void __launch_bounds__(128)
gptoss_gemm_down_mxfp4(const bf16* __restrict__ act, const e2m1x2* __restrict__ blocks,
                       const e8m0* __restrict__ scales, const bf16* __restrict__ bias,
                       const int* __restrict__ meta, float* __restrict__ y) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<false, MOE_B_MXFP4, true>(act, MOE_INTER, MoeTileWeights{blocks, scales, 1, 0, bias}, meta, y,
                                            HIDDEN, MOE_INTER);
#endif
}
