// FP8 E4M3 projections (src/backend/cuda/fp8.rs has the host side). A projection on the device is
// its [N, K] E4M3 bytes and an f32 scale per row and group of `group` input columns (`groups` per
// row; 1 for per-tensor and per-channel scales). Three jobs:
//   fp8_quantize_input      a product's bf16 input [T, K] quantized as the checkpoint's scheme says
//                           (per token, per token and group, or a static scale): the E4M3 codes
//                           (cuBLASLt's FP8 product reads them), their scales, and the dequantized
//                           values in bf16 (what the small-M kernel and the fallback read), so
//                           every path multiplies the same rounded inputs;
//   fp8_gemv_mM,            products of M <= 8 rows (decode): out[m][n] = sum_k x[m][k] w[n][k] *
//   fp8_gemv_r4_mM          scale(n, k) in fp32, the weights read once as E4M3 and widened in
//                           registers, split-K inside the block (2 or 4 rows per row group);
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

// One block per (token, group): grid (T, groups), up to FP8_QUANT_THREADS threads. group 0: the whole
// row is one group. upper_bound > 0 caps the largest magnitude a dynamic scale is computed from;
// static_scale > 0 replaces the dynamic scale. Writes xq [T, K] codes, xd [T, K] bf16 values
// (code * scale, rounded to bf16) and scales [T, groups].
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
        for (int i = first + threadIdx.x; i < last; i += blockDim.x) amax = fmaxf(amax, fabsf(bf16_to_f32(row[i])));
        amax = fp8_block_max(amax, scratch);
        if (upper_bound > 0.0f) amax = fminf(amax, upper_bound);
        scale = fmaxf(amax / FP8_MAX, FP8_MIN_SCALE);
    }
    for (int i = first + threadIdx.x; i < last; i += blockDim.x) {
        const unsigned int code = f32_to_e4m3(bf16_to_f32(row[i]) / scale);
        xq[(size_t)t * k + i] = (e4m3)code;
        xd[(size_t)t * k + i] = f32_to_bf16(e4m3_to_f32(code) * scale);
    }
    if (threadIdx.x == 0) scales[(size_t)t * gridDim.y + g] = scale;
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

// out[m][n] = sum_k x[m][k] * w[n][k] * scales[n][k / group] for M rows of x. A block of W warps
// (blockDim.x / 32, at most FP8_GEMV_MAX_WARPS) is W / splits row groups of `splits` warps; a
// row group owns ROWS consecutive weight rows and its warps split K between them (split-K inside
// the block: no atomics, no second pass, the same sum order on every run). A warp takes every
// splits-th step of 512 columns: each lane reads 16 weight bytes of each of its rows per step
// (FP8_GEMV_LOADS / ROWS steps in flight), widens them and multiplies them with the matching 16
// values of each x row (bf16, 16-byte loads, each reused for all ROWS rows). Where a row has
// several groups (group is a multiple of 16) each step's widened weights are multiplied by their
// group's scale, else the row's sum is scaled once at the end; the lanes' sums merge by shuffles, the warps' of a row group in shared memory, in a
// fixed order. Rows past n (a ragged end) read row n - 1 and are not written. K must be a
// multiple of 16 (the host checks). Launch: ceil(n / (ROWS * W / splits)) blocks (src/backend/
// cuda/fp8.rs, GemvGeometry, chooses ROWS, W and splits per shape).
template <int M, int ROWS>
__device__ __forceinline__ void fp8_gemv(const bf16* __restrict__ x, const e4m3* __restrict__ w,
                                         const float* __restrict__ scales, float* __restrict__ out, int n, int k,
                                         int groups, int group, int splits) {
    constexpr int U = FP8_GEMV_LOADS / ROWS > 0 ? FP8_GEMV_LOADS / ROWS : 1;
    __shared__ float partial[FP8_GEMV_MAX_WARPS][M][ROWS];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row_groups = (blockDim.x >> 5) / splits;
    const int split = warp % splits;
    const int row0 = (blockIdx.x * row_groups + warp / splits) * ROWS;
    const e4m3* rows[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) rows[r] = w + (size_t)min(row0 + r, n - 1) * k;
    float acc[ROWS][M];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
    const int steps = (k + 511) / 512;
    await_previous_kernels();
    for (int base = split; base < steps; base += U * splits) {
        uint4 wv[U][ROWS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = (base + u * splits) * 512 + lane * 16;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                wv[u][r] = k0 < k ? __ldg(reinterpret_cast<const uint4*>(rows[r] + k0)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = (base + u * splits) * 512 + lane * 16;
            if (k0 >= k) continue;
            // A row of several groups has this step's scale folded into its widened weights.
            float s[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                s[r] = groups > 1 ? scales[(size_t)min(row0 + r, n - 1) * groups + k0 / group] : 1.0f;
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
    // One thread per (row group, m, row) adds its row group's warps in order.
    for (int t = threadIdx.x; t < row_groups * M * ROWS; t += blockDim.x) {
        const int g = t / (M * ROWS);
        const int m = (t / ROWS) % M;
        const int r = t % ROWS;
        const int row = (blockIdx.x * row_groups + g) * ROWS + r;
        if (row >= n) continue;
        float sum = 0.0f;
        for (int s = 0; s < splits; ++s) sum += partial[g * splits + s][m][r];
        out[(size_t)m * n + row] = groups > 1 ? sum : sum * scales[row];
    }
}

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
// groups of 2 weight rows, fp8_gemv_r4_mM of 4.
#define FP8_GEMV_PARAMS                                                                                  \
    const bf16 *__restrict__ x, const e4m3 *__restrict__ w, const float *__restrict__ scales,             \
        float *__restrict__ out, int n, int k, int groups, int group, int splits
#define FP8_GEMV_ARGS x, w, scales, out, n, k, groups, group, splits
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
