// Small-M products for decode: sum_k x[m][k] * w[n][k] for M <= 8 rows of x (bf16) against a
// row-major weight w [N, K] (bf16). Three entry families, eight each (M = 1..8):
//   gemv_mM           out[m][n] fp32 [M, N], like the cuBLASLt path;
//   gemv_swiglu_mM    the gate/up product ([2 * INTERMEDIATE, K], gate rows first) with SwiGLU
//                     applied to its own result: out[m][i] = bf16(silu(gate) * up), [M,
//                     INTERMEDIATE], so kernels/swiglu.cu does not run;
//   gemv_qkv_rope_mM  the q/k/v product ([(NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, K]) with
//                     kernels/qkv_rope.cu's work (bias, rotary embedding, q out, k and v into
//                     their cache slots) done on its own result, for models without QK_NORM (a
//                     per-head norm needs the whole head; the host keeps the separate kernel).
//
// Grid: one block per GEMV_ROWS weight rows, GEMV_WARPS warps per block (both from the host,
// src/backend/cuda/plan.rs). gemv_mM's block owns GEMV_ROWS consecutive rows; the fused entries'
// blocks own GEMV_PAIRS = GEMV_ROWS / 2 consecutive rows of a first half and the rows a half
// further on (gate i.. and up i..; head dims d.. and d + HEAD_DIM / 2..), so every pair the
// epilogue combines is in one block. The block splits K over its warps (split-K inside the
// block, so no atomics and no second pass); each lane reads 16 bytes (8 values) of every owned
// row per step, GEMV_UNROLL steps in flight, and reuses each 16-byte slice of x for all owned
// rows. Warps merge their partial sums in shared memory. K must be a multiple of 8, and for the
// fused entries INTERMEDIATE and HEAD_DIM / 2 multiples of GEMV_PAIRS (the host checks).

#define GEMV_UNROLL 2
#define GEMV_STEP (32 * 8)
#define GEMV_PAIRS (GEMV_ROWS / 2)
#define GEMV_HALF_HEAD (HEAD_DIM / 2)

__device__ __forceinline__ void gemv_unpack8(uint4 w, float* out) {
    const unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// Each warp's sums of x[m] · rows[r] over its share of K, into partial[warp][m][r]; returns
// after a barrier, so any thread may then add them up (gemv_total).
template <int M>
__device__ __forceinline__ void gemv_partials(const bf16* __restrict__ x,
                                              const bf16* const (&rows)[GEMV_ROWS],
                                              int k,
                                              float (&partial)[GEMV_WARPS][M][GEMV_ROWS]) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    // This warp's share of K, in whole steps.
    const int steps = (k + GEMV_STEP - 1) / GEMV_STEP;
    const int per_warp = (steps + GEMV_WARPS - 1) / GEMV_WARPS;
    const int k_begin = warp * per_warp * GEMV_STEP;
    const int k_end = min(k, k_begin + per_warp * GEMV_STEP);

    float acc[M][GEMV_ROWS];
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) acc[m][r] = 0.0f;
    }
    // No weight is prefetched into L2 before the wait: in a graph with programmatic launch that
    // made a batch-1 step 8% slower (docs/benchmarks.md, 2026-11-29), so the kernel waits for the
    // one that writes x first.
    await_previous_kernels();

    for (int base = k_begin; base < k_end; base += GEMV_UNROLL * GEMV_STEP) {
        uint4 wv[GEMV_UNROLL][GEMV_ROWS];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int kk = base + u * GEMV_STEP + lane * 8;
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) {
                wv[u][r] = kk < k_end ? __ldg(reinterpret_cast<const uint4*>(rows[r] + kk)) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int kk = base + u * GEMV_STEP + lane * 8;
            if (kk >= k_end) continue;
            float wf[GEMV_ROWS][8];
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) gemv_unpack8(wv[u][r], wf[r]);
#pragma unroll
            for (int m = 0; m < M; ++m) {
                float xf[8];
                gemv_unpack8(__ldg(reinterpret_cast<const uint4*>(x + (size_t)m * k + kk)), xf);
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; ++r) {
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(xf[i], wf[r][i], acc[m][r]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) {
            const float v = warp_sum(acc[m][r]);
            if (lane == 0) partial[warp][m][r] = v;
        }
    }
    __syncthreads();
}

// x[m] · rows[r] over all of K, from gemv_partials' sums (always added in warp order).
template <int M>
__device__ __forceinline__ float gemv_total(const float (&partial)[GEMV_WARPS][M][GEMV_ROWS], int m, int r) {
    float total = 0.0f;
#pragma unroll
    for (int wi = 0; wi < GEMV_WARPS; ++wi) total += partial[wi][m][r];
    return total;
}

template <int M>
__device__ __forceinline__ void gemv_plain(const bf16* __restrict__ x,
                                           const bf16* __restrict__ w,
                                           float* __restrict__ out,
                                           int n,
                                           int k) {
    __shared__ float partial[GEMV_WARPS][M][GEMV_ROWS];
    const int row0 = blockIdx.x * GEMV_ROWS;
    const bf16* rows[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) rows[r] = w + (size_t)min(row0 + r, n - 1) * k;
    gemv_partials<M>(x, rows, k, partial);
    for (int i = threadIdx.x; i < M * GEMV_ROWS; i += blockDim.x) {
        const int m = i / GEMV_ROWS;
        const int r = i % GEMV_ROWS;
        if (row0 + r < n) out[(size_t)m * n + row0 + r] = gemv_total<M>(partial, m, r);
    }
}

// The rows of a paired block: GEMV_PAIRS rows from `first` and as many from `first + half`.
__device__ __forceinline__ void gemv_paired_rows(const bf16* __restrict__ w,
                                                 size_t first,
                                                 size_t half,
                                                 int k,
                                                 const bf16* (&rows)[GEMV_ROWS]) {
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        const size_t row = first + (r < GEMV_PAIRS ? r : half + r - GEMV_PAIRS);
        rows[r] = w + row * k;
    }
}

template <int M>
__device__ __forceinline__ void gemv_swiglu(const bf16* __restrict__ x,
                                            const bf16* __restrict__ w,
                                            bf16* __restrict__ out,
                                            int k) {
    __shared__ float partial[GEMV_WARPS][M][GEMV_ROWS];
    const int i0 = blockIdx.x * GEMV_PAIRS;
    const bf16* rows[GEMV_ROWS];
    gemv_paired_rows(w, i0, INTERMEDIATE, k, rows);
    gemv_partials<M>(x, rows, k, partial);
    for (int j = threadIdx.x; j < M * GEMV_PAIRS; j += blockDim.x) {
        const int m = j / GEMV_PAIRS;
        const int p = j % GEMV_PAIRS;
        const float gate = gemv_total<M>(partial, m, p);
        const float up = gemv_total<M>(partial, m, p + GEMV_PAIRS);
        out[(size_t)m * INTERMEDIATE + i0 + p] = f32_to_bf16(silu_times(gate, up));
    }
}

template <int M>
__device__ __forceinline__ void gemv_qkv_rope(const bf16* __restrict__ x,
                                              const bf16* __restrict__ w,
                                              const bf16* __restrict__ bias,
                                              const float* __restrict__ inv_freq,
                                              const int* __restrict__ positions,
                                              const int* __restrict__ slots,
                                              bf16* __restrict__ q_out,
                                              bf16* __restrict__ k_cache,
                                              bf16* __restrict__ v_cache,
                                              int k) {
    __shared__ float partial[GEMV_WARPS][M][GEMV_ROWS];
    constexpr int blocks_per_head = GEMV_HALF_HEAD / GEMV_PAIRS;
    const int h = blockIdx.x / blocks_per_head;
    const int d0 = (blockIdx.x % blocks_per_head) * GEMV_PAIRS;
    const bf16* rows[GEMV_ROWS];
    gemv_paired_rows(w, (size_t)h * HEAD_DIM + d0, GEMV_HALF_HEAD, k, rows);
    gemv_partials<M>(x, rows, k, partial);
    const bool is_q = h < NUM_Q_HEADS;
    const bool is_v = h >= NUM_Q_HEADS + NUM_KV_HEADS;
    for (int j = threadIdx.x; j < M * GEMV_PAIRS; j += blockDim.x) {
        const int m = j / GEMV_PAIRS;
        const int d = d0 + j % GEMV_PAIRS;
        const int slot = slots[m];
        if (!is_q && slot < 0) continue;
        float lo = gemv_total<M>(partial, m, j % GEMV_PAIRS);
        float hi = gemv_total<M>(partial, m, j % GEMV_PAIRS + GEMV_PAIRS);
#if QKV_BIAS
        lo += bf16_to_f32(bias[h * HEAD_DIM + d]);
        hi += bf16_to_f32(bias[h * HEAD_DIM + d + GEMV_HALF_HEAD]);
#endif
        if (!is_v) rotate_pair((float)positions[m] * inv_freq[d], lo, hi);
        bf16* dst = qkv_destination(h, m, slot, q_out, k_cache, v_cache);
        dst[d] = f32_to_bf16(lo);
        dst[d + GEMV_HALF_HEAD] = f32_to_bf16(hi);
    }
}

// The entry points, one line each so every name appears in the source (the host checks that
// every name it loads is defined here).
#define GEMV_PLAIN_PARAMS const bf16 *__restrict__ x, const bf16 *__restrict__ w, float *__restrict__ out, int n, int k
#define GEMV_SWIGLU_PARAMS const bf16 *__restrict__ x, const bf16 *__restrict__ w, bf16 *__restrict__ out, int k
#define GEMV_QKV_ROPE_PARAMS                                                                                   \
    const bf16 *__restrict__ x, const bf16 *__restrict__ w, const bf16 *__restrict__ bias,                     \
        const float *__restrict__ inv_freq, const int *__restrict__ positions, const int *__restrict__ slots, \
        bf16 *__restrict__ q_out, bf16 *__restrict__ k_cache, bf16 *__restrict__ v_cache, int k
#define GEMV_QKV_ROPE_ARGS x, w, bias, inv_freq, positions, slots, q_out, k_cache, v_cache, k
#define GEMV_ENTRY extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
GEMV_ENTRY gemv_m1(GEMV_PLAIN_PARAMS) { gemv_plain<1>(x, w, out, n, k); }
GEMV_ENTRY gemv_m2(GEMV_PLAIN_PARAMS) { gemv_plain<2>(x, w, out, n, k); }
GEMV_ENTRY gemv_m3(GEMV_PLAIN_PARAMS) { gemv_plain<3>(x, w, out, n, k); }
GEMV_ENTRY gemv_m4(GEMV_PLAIN_PARAMS) { gemv_plain<4>(x, w, out, n, k); }
GEMV_ENTRY gemv_m5(GEMV_PLAIN_PARAMS) { gemv_plain<5>(x, w, out, n, k); }
GEMV_ENTRY gemv_m6(GEMV_PLAIN_PARAMS) { gemv_plain<6>(x, w, out, n, k); }
GEMV_ENTRY gemv_m7(GEMV_PLAIN_PARAMS) { gemv_plain<7>(x, w, out, n, k); }
GEMV_ENTRY gemv_m8(GEMV_PLAIN_PARAMS) { gemv_plain<8>(x, w, out, n, k); }
GEMV_ENTRY gemv_swiglu_m1(GEMV_SWIGLU_PARAMS) { gemv_swiglu<1>(x, w, out, k); }
GEMV_ENTRY gemv_swiglu_m2(GEMV_SWIGLU_PARAMS) { gemv_swiglu<2>(x, w, out, k); }
GEMV_ENTRY gemv_swiglu_m3(GEMV_SWIGLU_PARAMS) { gemv_swiglu<3>(x, w, out, k); }
GEMV_ENTRY gemv_swiglu_m4(GEMV_SWIGLU_PARAMS) { gemv_swiglu<4>(x, w, out, k); }
GEMV_ENTRY gemv_swiglu_m5(GEMV_SWIGLU_PARAMS) { gemv_swiglu<5>(x, w, out, k); }
GEMV_ENTRY gemv_swiglu_m6(GEMV_SWIGLU_PARAMS) { gemv_swiglu<6>(x, w, out, k); }
GEMV_ENTRY gemv_swiglu_m7(GEMV_SWIGLU_PARAMS) { gemv_swiglu<7>(x, w, out, k); }
GEMV_ENTRY gemv_swiglu_m8(GEMV_SWIGLU_PARAMS) { gemv_swiglu<8>(x, w, out, k); }
GEMV_ENTRY gemv_qkv_rope_m1(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<1>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY gemv_qkv_rope_m2(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<2>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY gemv_qkv_rope_m3(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<3>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY gemv_qkv_rope_m4(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<4>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY gemv_qkv_rope_m5(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<5>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY gemv_qkv_rope_m6(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<6>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY gemv_qkv_rope_m7(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<7>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY gemv_qkv_rope_m8(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<8>(GEMV_QKV_ROPE_ARGS); }
