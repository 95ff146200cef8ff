// FP8 E4M3 projections (src/backend/cuda/fp8.rs has the host side). A projection on the device is
// its [N, K] E4M3 bytes and an f32 scale per row and group of `group` input columns (`groups` per
// row; 1 for per-tensor and per-channel scales). The kernels:
//   fp8_quantize_input      a product's bf16 input [T, K] quantized as the checkpoint's scheme says
//                           (per token, per token and group, or a static scale): the E4M3 codes
//                           (cuBLASLt's FP8 product reads them), their scales, and the dequantized
//                           values in bf16 (what the small-M kernel and the fallback read), so
//                           every path multiplies the same rounded inputs;
//   fp8_gemv_mM,            products of M <= 8 rows (decode): out[m][n] = sum_k x[m][k] w[n][k] *
//   fp8_gemv_r4_mM          scale(n, k) in fp32, the weights read once as E4M3 and widened in
//                           registers, split-K inside the block (2 or 4 rows per row group);
//   fp8_gemv_swiglu_mM      the same product of the gate/up weights with SwiGLU applied to its
//                           result (bf16 out; fp8_quantize_input then quantizes it for the down
//                           product, several blocks per token);
//   fp8_gemv_qkv_rope_mM    the same product of the q/k/v weights with the rope write done on its
//                           result (kernels/qkv_rope.cu does not run);
//   fp8_dequantize_weight   a projection widened to bf16 (scales applied), for the products that
//                           cuBLASLt's FP8 path does not take (block scales, weight-only FP8);
//   fp8_scale_output        the scales applied to cuBLASLt's FP8 product of the codes;
//   fp8_add_rmsnorm         kernels/rmsnorm.cu's residual add and RMSNorm with its output row also
//                           quantized per token (or by a static scale) for the FP8 product that
//                           reads it, so no fp8_quantize_input launch runs before q/k/v and gate/up;
//   fp8_swiglu_quantize     kernels/swiglu.cu's SwiGLU with its output quantized the same way for
//                           the down product (one launch instead of SwiGLU and fp8_quantize_input).
// E4M3 rounding here is bit for bit the host's (f32_to_e4m3_fast): nearest, ties to even,
// saturating at +-448.

typedef unsigned char e4m3;

#define FP8_MAX 448.0f
// The smallest dynamic scale (model::fp8::MIN_DYNAMIC_SCALE): 1 / (448 * 512).
#define FP8_MIN_SCALE (1.0f / (448.0f * 512.0f))
// The most threads of fp8_quantize_input's and fp8_swiglu_quantize's blocks (the host launches a
// multiple of 32 covering the group once, at most these), and the values each thread of the
// latter keeps in registers.
#define FP8_QUANT_THREADS 1024
#define FP8_SWIGLU_SLOTS ((INTERMEDIATE + FP8_QUANT_THREADS - 1) / FP8_QUANT_THREADS)
// The small-M kernels' most warps per block, and 16-byte weight loads in flight per lane.
#define FP8_GEMV_MAX_WARPS 8
#define FP8_GEMV_LOADS 8
// 1: the small-M kernels load their first steps' weights before waiting for the previous kernel
// (scripts/fp8-check.cu's chain mode builds 0 too, to measure it).
#ifndef FP8_EARLY_WEIGHTS
#define FP8_EARLY_WEIGHTS 1
#endif

// Rounds v to an E4M3 code (see the file comment).
__device__ __forceinline__ unsigned int f32_to_e4m3(float v) {
    const unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fu;
    const unsigned int sign = (u >> 24) & 0x80u;
    const float a = fabsf(v);
    if (a >= FP8_MAX) return sign | 0x7eu;
    if (a < 0.015625f) return sign | (unsigned int)__float2int_rn(a * 512.0f);
    const unsigned int b = __float_as_uint(a);
    const unsigned int mantissa = (b >> 20) & 7u;
    const unsigned int rest = b & 0xfffffu;
    unsigned int code = (((b >> 23) - 120u) << 3) | mantissa;
    if (rest > 0x80000u || (rest == 0x80000u && (mantissa & 1u))) code += 1u;
    return sign | code;
}

// Widens an E4M3 code to float (exact; NaN codes are never written by the quantizers).
__device__ __forceinline__ float e4m3_to_f32(unsigned int code) {
    const unsigned int sign = (code & 0x80u) << 24;
    const unsigned int em = code & 0x7fu;
    const float magnitude = em >= 8u ? __uint_as_float((em + (120u << 3)) << 20) : (float)em * 0.001953125f;
    return __uint_as_float(__float_as_uint(magnitude) | sign);
}

// Widens two E4M3 codes (the low byte first) to floats: one conversion instruction where the
// GPU has it (sm_89 and newer), else bit arithmetic.
__device__ __forceinline__ void e4m3x2_to_f32(unsigned int pair, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned int halves;
    unsigned short packed = (unsigned short)pair;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(packed));
    unsigned short l = (unsigned short)(halves & 0xffffu), h = (unsigned short)(halves >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
#else
    lo = e4m3_to_f32(pair & 0xffu);
    hi = e4m3_to_f32((pair >> 8) & 0xffu);
#endif
}

// Largest value over the block (every thread receives it); `scratch` holds 32 floats.
__device__ __forceinline__ float fp8_block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float m = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
    __syncthreads();
    return m;
}

// The entry points are left out where another family compiles this file for its device functions
// alone (FP8_NO_ENTRIES: kernels/moe_fp8.cu).
#ifndef FP8_NO_ENTRIES
// Grid (T, groups, chunks), up to FP8_QUANT_THREADS threads. group 0: the whole row is one group.
// upper_bound > 0 caps the largest magnitude a dynamic scale is computed from; static_scale > 0
// replaces the dynamic scale. Writes xq [T, K] codes, xd [T, K] bf16 values (code * scale,
// rounded to bf16) and scales [T, groups]. Each block reads its whole group for the scale and
// writes the codes of its chunk (a gridDim.z-th of the group), so a decode step's wide row
// (the down product's input) is quantized by several blocks instead of one; chunk 0 writes the
// scale.
extern "C" __global__ void __launch_bounds__(FP8_QUANT_THREADS)
fp8_quantize_input(const bf16* __restrict__ x, int k, int group, float upper_bound, float static_scale,
                   e4m3* __restrict__ xq, bf16* __restrict__ xd, float* __restrict__ scales) {
    __shared__ float scratch[32];
    await_previous_kernels();
    const int t = blockIdx.x;
    const int g = blockIdx.y;
    const int width = group > 0 ? group : k;
    const int first = g * width;
    const int last = min(first + width, k);
    const bf16* row = x + (size_t)t * k;
    float scale = static_scale;
    if (scale <= 0.0f) {
        float amax = 0.0f;
#pragma unroll 8
        for (int i = first + threadIdx.x; i < last; i += blockDim.x) amax = fmaxf(amax, fabsf(bf16_to_f32(row[i])));
        amax = fp8_block_max(amax, scratch);
        if (upper_bound > 0.0f) amax = fminf(amax, upper_bound);
        scale = fmaxf(amax / FP8_MAX, FP8_MIN_SCALE);
    }
    const int span = (width + gridDim.z - 1) / gridDim.z;
    const int begin = first + blockIdx.z * span;
    const int end = min(begin + span, last);
#pragma unroll 4
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned int code = f32_to_e4m3(bf16_to_f32(row[i]) / scale);
        xq[(size_t)t * k + i] = (e4m3)code;
        xd[(size_t)t * k + i] = f32_to_bf16(e4m3_to_f32(code) * scale);
    }
    if (threadIdx.x == 0 && blockIdx.z == 0) scales[(size_t)t * gridDim.y + g] = scale;
}

// kernels/swiglu.cu's SwiGLU of the gate/up product ([T, 2 * INTERMEDIATE] fp32, gate half
// first) quantized as fp8_quantize_input quantizes its bf16 output (the same values, the same
// rounding), for the down product that reads it: codes into xq, codes times the scale into xd,
// scales [T, groups]. The bf16 SwiGLU output itself is not written (the FP8 product reads xq or
// xd). With x_scales (the gate/up input's per-token scales, the buffer `scales` is then
// overwritten) and w_scales (its per-row scales), gate_up is cuBLASLt's unscaled product of the
// codes and each value is first scaled as fp8_scale_output would (the same arithmetic), so that
// pass does not run. Grid (T, groups), group 0: the whole row is one group; a multiple of 32
// threads covering the group once, at most FP8_QUANT_THREADS (the group is read once into
// registers: at decode one block per token is the whole launch).
__device__ __forceinline__ float fp8_swiglu_value(const float* row, int i, float sx, const float* w_scales) {
    float gate = row[i], up = row[INTERMEDIATE + i];
    if (w_scales) {
        gate = __fmul_rn(gate, __fmul_rn(sx, w_scales[i]));
        up = __fmul_rn(up, __fmul_rn(sx, w_scales[INTERMEDIATE + i]));
    }
    return bf16_to_f32(f32_to_bf16(silu_times(gate, up)));
}

extern "C" __global__ void __launch_bounds__(FP8_QUANT_THREADS)
fp8_swiglu_quantize(const float* __restrict__ gate_up, const float* x_scales, const float* __restrict__ w_scales,
                    int group, float upper_bound, float static_scale, e4m3* __restrict__ xq, bf16* __restrict__ xd,
                    float* scales) {
    __shared__ float scratch[32];
    await_previous_kernels();
    const int t = blockIdx.x;
    const int g = blockIdx.y;
    // Every thread reads the token's input scale before any writes the new one.
    const float sx = w_scales ? x_scales[t] : 1.0f;
    __syncthreads();
    const int width = group > 0 ? group : INTERMEDIATE;
    const int first = g * width;
    const int last = min(first + width, INTERMEDIATE);
    const float* row = gate_up + (size_t)t * 2 * INTERMEDIATE;
    // The group's values are read once and kept in registers.
    float v[FP8_SWIGLU_SLOTS];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < FP8_SWIGLU_SLOTS; ++j) {
        const int i = first + threadIdx.x + j * blockDim.x;
        v[j] = i < last ? fp8_swiglu_value(row, i, sx, w_scales) : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
    float scale = static_scale;
    if (scale <= 0.0f) {
        amax = fp8_block_max(amax, scratch);
        if (upper_bound > 0.0f) amax = fminf(amax, upper_bound);
        scale = fmaxf(amax / FP8_MAX, FP8_MIN_SCALE);
    }
#pragma unroll
    for (int j = 0; j < FP8_SWIGLU_SLOTS; ++j) {
        const int i = first + threadIdx.x + j * blockDim.x;
        if (i >= last) break;
        const unsigned int code = f32_to_e4m3(v[j] / scale);
        xq[(size_t)t * INTERMEDIATE + i] = (e4m3)code;
        xd[(size_t)t * INTERMEDIATE + i] = f32_to_bf16(e4m3_to_f32(code) * scale);
    }
    if (threadIdx.x == 0) scales[(size_t)t * gridDim.y + g] = scale;
}

#endif  // FP8_NO_ENTRIES

// What a small-M launch does with its sums (the entry families below):
//   FP8_PLAIN     out[m][n] fp32, like cuBLASLt's product;
//   FP8_SWIGLU    the gate/up product (gate rows first, INTERMEDIATE each) with SwiGLU applied
//                 to its own result: out[m][i] = bf16(silu(gate) * up), [M, INTERMEDIATE], the
//                 same value fp8_swiglu_quantize quantizes (fp8_quantize_input then quantizes it
//                 for the down product);
//   FP8_QKV_ROPE  the q/k/v product with kernels/qkv_rope.cu's work (bias, rotary embedding, q
//                 out, k and v into their cache slots) done on its own result, through the same
//                 prelude helpers as kernels/gemv.cu's gemv_qkv_rope (not for QK_NORM models).
// A paired launch's row group owns ROWS / 2 consecutive rows of a first half and the rows a half
// further on (gate i.. and up i..; head dims d.. and d + HEAD_DIM / 2..), so every pair the
// epilogue combines is in one row group.
#define FP8_PLAIN 0
#define FP8_SWIGLU 1
#define FP8_QKV_ROPE 2

// Weight row r of row group g (see above); a paired launch has n / ROWS row groups exactly.
template <int MODE, int ROWS>
__device__ __forceinline__ int fp8_row(int g, int r) {
    constexpr int P = ROWS / 2;
    if constexpr (MODE == FP8_PLAIN) {
        return g * ROWS + r;
    } else if constexpr (MODE == FP8_SWIGLU) {
        return r < P ? g * P + r : INTERMEDIATE + g * P + r - P;
    } else {
        constexpr int per_head = HEAD_DIM / 2 / P;
        const int first = (g / per_head) * HEAD_DIM + (g % per_head) * P;
        return r < P ? first + r : first + HEAD_DIM / 2 + r - P;
    }
}

// Each warp's sums of x[m] · w[row] over its share of K for its row group's ROWS rows, into
// partial[warp][m][r] (unscaled where a row has one group, the group scales folded in where it
// has several); returns after a barrier. A block of W warps (blockDim.x / 32, at most
// FP8_GEMV_MAX_WARPS) is W / splits row groups of `splits` warps; a row group's warps split K
// between them (split-K inside the block: no atomics, no second pass, the same sum order on every
// run). A warp takes every splits-th step of 512 columns: each lane reads 16 weight bytes of each
// of its rows per step (FP8_GEMV_LOADS / ROWS steps in flight), widens them and multiplies them
// with the matching 16 values of each x row (bf16, 16-byte loads, each reused for all ROWS rows).
// The first steps' weights are loaded before the kernel waits for the previous one (the weights
// do not depend on it; x's loads follow the wait), so that latency overlaps the previous
// kernel's tail in a decode graph. Rows past the end (a ragged plain product) read row n - 1.
template <int M, int ROWS, int MODE>
__device__ __forceinline__ void fp8_gemv_partials(const bf16* __restrict__ x, const e4m3* __restrict__ w,
                                                  const float* __restrict__ scales, int n, int k, int groups,
                                                  int group, int splits,
                                                  float (&partial)[FP8_GEMV_MAX_WARPS][M][ROWS]) {
    constexpr int U = FP8_GEMV_LOADS / ROWS > 0 ? FP8_GEMV_LOADS / ROWS : 1;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row_groups = (blockDim.x >> 5) / splits;
    const int split = warp % splits;
    const int g = blockIdx.x * row_groups + warp / splits;
    int row_of[ROWS];
    const e4m3* rows[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        row_of[r] = MODE == FP8_PLAIN ? min(fp8_row<MODE, ROWS>(g, r), n - 1)
                                      : fp8_row<MODE, ROWS>(min(g, n / ROWS - 1), r);
        rows[r] = w + (size_t)row_of[r] * k;
    }
    float acc[ROWS][M];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
    const int steps = (k + 511) / 512;
    uint4 wv[U][ROWS];
    const auto load_weights = [&](int base) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = (base + u * splits) * 512 + lane * 16;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                wv[u][r] = k0 < k ? __ldg(reinterpret_cast<const uint4*>(rows[r] + k0)) : make_uint4(0, 0, 0, 0);
        }
    };
#if FP8_EARLY_WEIGHTS
    load_weights(split);
    await_previous_kernels();
#else
    await_previous_kernels();
    load_weights(split);
#endif
    for (int base = split; base < steps; base += U * splits) {
        if (base != split) load_weights(base);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = (base + u * splits) * 512 + lane * 16;
            if (k0 >= k) continue;
            // A row of several groups has this step's scale folded into its widened weights.
            float s[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) s[r] = groups > 1 ? scales[(size_t)row_of[r] * groups + k0 / group] : 1.0f;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float wf[ROWS][8];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const unsigned int w0 = half ? wv[u][r].z : wv[u][r].x;
                    const unsigned int w1 = half ? wv[u][r].w : wv[u][r].y;
                    e4m3x2_to_f32(w0, wf[r][0], wf[r][1]);
                    e4m3x2_to_f32(w0 >> 16, wf[r][2], wf[r][3]);
                    e4m3x2_to_f32(w1, wf[r][4], wf[r][5]);
                    e4m3x2_to_f32(w1 >> 16, wf[r][6], wf[r][7]);
                    if (groups > 1) {
#pragma unroll
                        for (int j = 0; j < 8; ++j) wf[r][j] *= s[r];
                    }
                }
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + (size_t)m * k + k0 + half * 8));
                    const unsigned int words[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float lo = __uint_as_float(words[j] << 16);
                        const float hi = __uint_as_float(words[j] & 0xffff0000u);
#pragma unroll
                        for (int r = 0; r < ROWS; ++r) {
                            acc[r][m] = fmaf(lo, wf[r][2 * j], acc[r][m]);
                            acc[r][m] = fmaf(hi, wf[r][2 * j + 1], acc[r][m]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const float sum = warp_sum(acc[r][m]);
            if (lane == 0) partial[warp][m][r] = sum;
        }
    __syncthreads();
}

// Row r of the block's row group `local` for x row m over all of K: its warps' sums added in
// order, times the row's scale where it has one group.
template <int M, int ROWS, int MODE>
__device__ __forceinline__ float fp8_gemv_total(const float (&partial)[FP8_GEMV_MAX_WARPS][M][ROWS], int local, int m,
                                                int r, int row, const float* __restrict__ scales, int groups,
                                                int splits) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[local * splits + s][m][r];
    return groups > 1 ? sum : sum * scales[row];
}

// out[m][n] = sum_k x[m][k] * w[n][k] * scale(n, k) for M rows of x (FP8_PLAIN). Launch:
// ceil(n / (ROWS * W / splits)) blocks (src/backend/cuda/fp8.rs, GemvGeometry, chooses ROWS, W
// and splits per shape). K must be a multiple of 16 (the host checks).
template <int M, int ROWS>
__device__ __forceinline__ void fp8_gemv(const bf16* __restrict__ x, const e4m3* __restrict__ w,
                                         const float* __restrict__ scales, float* __restrict__ out, int n, int k,
                                         int groups, int group, int splits) {
    __shared__ float partial[FP8_GEMV_MAX_WARPS][M][ROWS];
    fp8_gemv_partials<M, ROWS, FP8_PLAIN>(x, w, scales, n, k, groups, group, splits, partial);
    const int row_groups = (blockDim.x >> 5) / splits;
    // One thread per (row group, m, row) adds its row group's warps in order.
    for (int t = threadIdx.x; t < row_groups * M * ROWS; t += blockDim.x) {
        const int local = t / (M * ROWS);
        const int m = (t / ROWS) % M;
        const int r = t % ROWS;
        const int row = (blockIdx.x * row_groups + local) * ROWS + r;
        if (row >= n) continue;
        out[(size_t)m * n + row] = fp8_gemv_total<M, ROWS, FP8_PLAIN>(partial, local, m, r, row, scales, groups, splits);
    }
}

// The gate/up product [2 * INTERMEDIATE, k] with SwiGLU applied (FP8_SWIGLU): out [M,
// INTERMEDIATE] bf16. Launch: ceil(INTERMEDIATE / (2 * W / splits)) blocks of row groups of 4.
template <int M>
__device__ __forceinline__ void fp8_gemv_swiglu(const bf16* __restrict__ x, const e4m3* __restrict__ w,
                                                const float* __restrict__ scales, bf16* __restrict__ out, int k,
                                                int groups, int group, int splits) {
    constexpr int ROWS = 4, P = ROWS / 2;
    __shared__ float partial[FP8_GEMV_MAX_WARPS][M][ROWS];
    fp8_gemv_partials<M, ROWS, FP8_SWIGLU>(x, w, scales, 2 * INTERMEDIATE, k, groups, group, splits, partial);
    const int row_groups = (blockDim.x >> 5) / splits;
    for (int t = threadIdx.x; t < row_groups * M * P; t += blockDim.x) {
        const int local = t / (M * P);
        const int m = (t / P) % M;
        const int p = t % P;
        const int g = blockIdx.x * row_groups + local;
        if (g >= INTERMEDIATE / P) continue;
        const int gate_row = fp8_row<FP8_SWIGLU, ROWS>(g, p);
        const float gate = fp8_gemv_total<M, ROWS, FP8_SWIGLU>(partial, local, m, p, gate_row, scales, groups, splits);
        const float up = fp8_gemv_total<M, ROWS, FP8_SWIGLU>(partial, local, m, p + P, gate_row + INTERMEDIATE, scales,
                                                             groups, splits);
        out[(size_t)m * INTERMEDIATE + gate_row] = f32_to_bf16(silu_times(gate, up));
    }
}

// The q/k/v product [(NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, k] with the rope write done on
// its result (FP8_QKV_ROPE; as kernels/gemv.cu's gemv_qkv_rope, bit for bit what
// kernels/qkv_rope.cu does with the plain product). Launch: ceil(heads * HEAD_DIM / (4 * W /
// splits)) blocks of row groups of 4.
template <int M>
__device__ __forceinline__ void fp8_gemv_qkv_rope(const bf16* __restrict__ x, const e4m3* __restrict__ w,
                                                  const float* __restrict__ scales, const bf16* __restrict__ bias,
                                                  const float* __restrict__ inv_freq, const int* __restrict__ positions,
                                                  const int* __restrict__ slots, bf16* __restrict__ q_out,
                                                  kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache,
                                                  const float* __restrict__ kv_scales, int k, int groups, int group,
                                                  int splits) {
    constexpr int ROWS = 4, P = ROWS / 2;
    constexpr int HEADS = NUM_Q_HEADS + 2 * NUM_KV_HEADS;
    __shared__ float partial[FP8_GEMV_MAX_WARPS][M][ROWS];
    fp8_gemv_partials<M, ROWS, FP8_QKV_ROPE>(x, w, scales, HEADS * HEAD_DIM, k, groups, group, splits, partial);
    const int row_groups = (blockDim.x >> 5) / splits;
    for (int t = threadIdx.x; t < row_groups * M * P; t += blockDim.x) {
        const int local = t / (M * P);
        const int m = (t / P) % M;
        const int p = t % P;
        const int g = blockIdx.x * row_groups + local;
        if (g >= HEADS * HEAD_DIM / ROWS) continue;
        const int row = fp8_row<FP8_QKV_ROPE, ROWS>(g, p);
        const int h = row / HEAD_DIM;
        const int d = row % HEAD_DIM;
        const bool is_q = h < NUM_Q_HEADS;
        const bool is_v = h >= NUM_Q_HEADS + NUM_KV_HEADS;
        const int slot = slots[m];
        if (!is_q && slot < 0) continue;
        float lo = fp8_gemv_total<M, ROWS, FP8_QKV_ROPE>(partial, local, m, p, row, scales, groups, splits);
        float hi = fp8_gemv_total<M, ROWS, FP8_QKV_ROPE>(partial, local, m, p + P, row + HEAD_DIM / 2, scales, groups,
                                                         splits);
#if QKV_BIAS
        lo += bf16_to_f32(bias[row]);
        hi += bf16_to_f32(bias[row + HEAD_DIM / 2]);
#endif
        if (!is_v) rotate_pair((float)positions[m] * inv_freq[d], lo, hi);
#if KV_FP8
        qkv_store(h, m, slot, d, lo, hi, q_out, k_cache, v_cache, kv_scales);
#else
        bf16* dst = qkv_destination(h, m, slot, q_out, k_cache, v_cache);
        dst[d] = f32_to_bf16(lo);
        dst[d + HEAD_DIM / 2] = f32_to_bf16(hi);
#endif
    }
}

#ifndef FP8_NO_ENTRIES
// w [n, k] widened to bf16 with its scales into out [n, k]: each thread 16 columns of a row per
// step, the grid striding over the matrix. K must be a multiple of 16.
extern "C" __global__ void fp8_dequantize_weight(const e4m3* __restrict__ w, const float* __restrict__ scales,
                                                 int n, int k, int groups, int group, bf16* __restrict__ out) {
    await_previous_kernels();
    const size_t chunks = (size_t)n * (k / 16);
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += (size_t)gridDim.x * blockDim.x) {
        const size_t row = c / (k / 16);
        const int col = (int)(c % (k / 16)) * 16;
        const float s = scales[row * groups + (groups > 1 ? col / group : 0)];
        const uint4 wv = *reinterpret_cast<const uint4*>(w + row * k + col);
        const unsigned int words[4] = {wv.x, wv.y, wv.z, wv.w};
        unsigned int packed[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float a, b, c2, d;
            e4m3x2_to_f32(words[j], a, b);
            e4m3x2_to_f32(words[j] >> 16, c2, d);
            packed[2 * j] = (unsigned int)f32_to_bf16(a * s) | ((unsigned int)f32_to_bf16(b * s) << 16);
            packed[2 * j + 1] = (unsigned int)f32_to_bf16(c2 * s) | ((unsigned int)f32_to_bf16(d * s) << 16);
        }
        uint4* dst = reinterpret_cast<uint4*>(out + row * k + col);
        dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    }
}

#define FP8_RMS_SLOTS ((HIDDEN + RMS_THREADS - 1) / RMS_THREADS)

// add_rmsnorm (kernels/rmsnorm.cu, without its row list: every row) whose bf16 output row is also
// quantized as fp8_quantize_input quantizes it with group 0 (the same values, the same rounding):
// codes into xq, codes times the scale into xd, the row's scale into scales[row]. With x_scales
// (the product's per-token input scales, the buffer `scales` is then overwritten) and w_scales
// (its per-row scales), delta is cuBLASLt's unscaled FP8 product of the codes and each value is
// first scaled as fp8_scale_output would (the same roundings), so that pass does not run. One
// block of RMS_THREADS threads per row.
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
fp8_add_rmsnorm(float* __restrict__ residual, const float* __restrict__ delta, const float* x_scales,
                const float* __restrict__ w_scales, const bf16* __restrict__ weight, bf16* __restrict__ out,
                float upper_bound, float static_scale, e4m3* __restrict__ xq, bf16* __restrict__ xd, float* scales) {
    float w[FP8_RMS_SLOTS];
#pragma unroll
    for (int k = 0; k < FP8_RMS_SLOTS; ++k) {
        const int i = threadIdx.x + k * RMS_THREADS;
        w[k] = i < HIDDEN ? bf16_to_f32(weight[i]) : 0.0f;
    }
    await_previous_kernels();
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    // Read before block_sum's barrier, so before thread 0 writes the row's new scale.
    const float sx = w_scales ? x_scales[r] : 1.0f;
    float* x = residual + (size_t)r * HIDDEN;
    float v[FP8_RMS_SLOTS];
    float sumsq = 0.0f;
#pragma unroll
    for (int k = 0; k < FP8_RMS_SLOTS; ++k) {
        const int i = threadIdx.x + k * RMS_THREADS;
        v[k] = 0.0f;
        if (i < HIDDEN) {
            v[k] = x[i];
            if (delta) {
                const float d = delta[(size_t)r * HIDDEN + i];
                // Rounded as fp8_scale_output rounds (no fused multiply-add).
                v[k] += w_scales ? __fmul_rn(d, __fmul_rn(sx, w_scales[i])) : d;
                x[i] = v[k];
            }
        }
        sumsq += v[k] * v[k];
    }
    const float inv = rsqrtf(block_sum(sumsq, scratch) / (float)HIDDEN + RMS_EPS);
    const size_t row = (size_t)r * HIDDEN;
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < FP8_RMS_SLOTS; ++k) {
        const int i = threadIdx.x + k * RMS_THREADS;
        if (i < HIDDEN) {
            const bf16 y = f32_to_bf16(v[k] * inv * w[k]);
            out[row + i] = y;
            v[k] = bf16_to_f32(y);
            amax = fmaxf(amax, fabsf(v[k]));
        }
    }
    float scale = static_scale;
    if (scale <= 0.0f) {
        amax = fp8_block_max(amax, scratch);
        if (upper_bound > 0.0f) amax = fminf(amax, upper_bound);
        scale = fmaxf(amax / FP8_MAX, FP8_MIN_SCALE);
    }
#pragma unroll
    for (int k = 0; k < FP8_RMS_SLOTS; ++k) {
        const int i = threadIdx.x + k * RMS_THREADS;
        if (i < HIDDEN) {
            const unsigned int code = f32_to_e4m3(v[k] / scale);
            xq[row + i] = (e4m3)code;
            xd[row + i] = f32_to_bf16(e4m3_to_f32(code) * scale);
        }
    }
    if (threadIdx.x == 0) scales[r] = scale;
}

// out[i][j] *= x_scales[i] * w_scales[j] over an [m, n] fp32 product of unscaled codes (cuBLASLt's
// FP8 product): each thread 4 consecutive outputs per step, the grid striding. n must be a
// multiple of 4.
extern "C" __global__ void fp8_scale_output(float* __restrict__ out, const float* __restrict__ x_scales,
                                            const float* __restrict__ w_scales, int m, int n) {
    await_previous_kernels();
    const size_t quads = (size_t)m * n / 4;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += (size_t)gridDim.x * blockDim.x) {
        const size_t i = q * 4 / n;
        const int j = (int)(q * 4 % n);
        float4 v = reinterpret_cast<float4*>(out)[q];
        const float s = x_scales[i];
        v.x *= s * w_scales[j];
        v.y *= s * w_scales[j + 1];
        v.z *= s * w_scales[j + 2];
        v.w *= s * w_scales[j + 3];
        reinterpret_cast<float4*>(out)[q] = v;
    }
}

// The small-M entry points, one line each so every name appears in the source: fp8_gemv_mM row
// groups of 2 weight rows, fp8_gemv_r4_mM of 4 (FP8_PLAIN); fp8_gemv_swiglu_mM and
// fp8_gemv_qkv_rope_mM row groups of 4 (2 pairs).
#define FP8_GEMV_PARAMS                                                                                  \
    const bf16 *__restrict__ x, const e4m3 *__restrict__ w, const float *__restrict__ scales,             \
        float *__restrict__ out, int n, int k, int groups, int group, int splits
#define FP8_GEMV_ARGS x, w, scales, out, n, k, groups, group, splits
#define FP8_GEMV_SWIGLU_PARAMS                                                                           \
    const bf16 *__restrict__ x, const e4m3 *__restrict__ w, const float *__restrict__ scales,             \
        bf16 *__restrict__ out, int k, int groups, int group, int splits
#define FP8_GEMV_SWIGLU_ARGS x, w, scales, out, k, groups, group, splits
#define FP8_GEMV_QKV_ROPE_PARAMS                                                                         \
    const bf16 *__restrict__ x, const e4m3 *__restrict__ w, const float *__restrict__ scales,             \
        const bf16 *__restrict__ bias, const float *__restrict__ inv_freq, const int *__restrict__ positions, \
        const int *__restrict__ slots, bf16 *__restrict__ q_out, kv_t *__restrict__ k_cache,              \
        kv_t *__restrict__ v_cache, const float *__restrict__ kv_scales, int k, int groups, int group, int splits
#define FP8_GEMV_QKV_ROPE_ARGS \
    x, w, scales, bias, inv_freq, positions, slots, q_out, k_cache, v_cache, kv_scales, k, groups, group, splits
#define FP8_GEMV_ENTRY extern "C" __global__ void __launch_bounds__(FP8_GEMV_MAX_WARPS * 32)
FP8_GEMV_ENTRY fp8_gemv_m1(FP8_GEMV_PARAMS) { fp8_gemv<1, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_m2(FP8_GEMV_PARAMS) { fp8_gemv<2, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_m3(FP8_GEMV_PARAMS) { fp8_gemv<3, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_m4(FP8_GEMV_PARAMS) { fp8_gemv<4, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_m5(FP8_GEMV_PARAMS) { fp8_gemv<5, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_m6(FP8_GEMV_PARAMS) { fp8_gemv<6, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_m7(FP8_GEMV_PARAMS) { fp8_gemv<7, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_m8(FP8_GEMV_PARAMS) { fp8_gemv<8, 2>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m1(FP8_GEMV_PARAMS) { fp8_gemv<1, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m2(FP8_GEMV_PARAMS) { fp8_gemv<2, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m3(FP8_GEMV_PARAMS) { fp8_gemv<3, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m4(FP8_GEMV_PARAMS) { fp8_gemv<4, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m5(FP8_GEMV_PARAMS) { fp8_gemv<5, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m6(FP8_GEMV_PARAMS) { fp8_gemv<6, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m7(FP8_GEMV_PARAMS) { fp8_gemv<7, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_r4_m8(FP8_GEMV_PARAMS) { fp8_gemv<8, 4>(FP8_GEMV_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m1(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<1>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m2(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<2>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m3(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<3>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m4(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<4>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m5(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<5>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m6(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<6>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m7(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<7>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_swiglu_m8(FP8_GEMV_SWIGLU_PARAMS) { fp8_gemv_swiglu<8>(FP8_GEMV_SWIGLU_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m1(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<1>(FP8_GEMV_QKV_ROPE_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m2(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<2>(FP8_GEMV_QKV_ROPE_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m3(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<3>(FP8_GEMV_QKV_ROPE_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m4(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<4>(FP8_GEMV_QKV_ROPE_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m5(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<5>(FP8_GEMV_QKV_ROPE_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m6(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<6>(FP8_GEMV_QKV_ROPE_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m7(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<7>(FP8_GEMV_QKV_ROPE_ARGS); }
FP8_GEMV_ENTRY fp8_gemv_qkv_rope_m8(FP8_GEMV_QKV_ROPE_PARAMS) { fp8_gemv_qkv_rope<8>(FP8_GEMV_QKV_ROPE_ARGS); }
#endif  // FP8_NO_ENTRIES
