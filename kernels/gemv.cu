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
// Two paths, by M (GemvShape; all sizes from the host, src/backend/cuda/plan.rs):
//   M >= GEMV_MMA_FROM tensor cores (mma.sync, sm_80 or newer): a block of GEMV_MMA_WARPS warps
//                      owns 16 rows; each warp streams its share of K's weights through a ring
//                      of GEMV_MMA_STAGES shared-memory slots (dynamic shared memory,
//                      GemvShape::ring_bytes) and x's through registers. The host passes
//                      GEMV_MMA_FROM 1 (every M), or 9 where there are no tensor cores or a
//                      block cannot have the rings.
//   M < GEMV_MMA_FROM  CUDA cores: a block of GEMV_WARPS warps owns GEMV_ROWS weight rows; each
//                      lane reads 16 bytes (8 values) of every owned row per step, GEMV_UNROLL
//                      steps in flight, and reuses each 16-byte slice of x for all owned rows.
// Either way the block splits K over its warps (split-K inside the block, so no atomics and no
// second pass) and the warps merge their partial sums in shared memory. gemv_mM's block owns
// consecutive rows; the fused entries' blocks own `pairs` consecutive rows of a first half and
// the rows a half further on (gate i.. and up i..; head dims d.. and d + HEAD_DIM / 2..), so
// every pair the epilogue combines is in one block. K must be a multiple of 8, and for the fused
// entries INTERMEDIATE and HEAD_DIM / 2 multiples of 8 (the host checks).

#define GEMV_UNROLL 2
#define GEMV_STEP (32 * 8)
#define GEMV_HALF_HEAD (HEAD_DIM / 2)
#define GEMV_MMA_ROWS 16
// Values of K per ring slot of the tensor-core path: 128 bytes of each weight row.
#define GEMV_MMA_CHUNK 64

// The block geometry of the M-row entries: which inner loop, how many weight rows and warps a
// block has, and its dynamic shared memory (plan::gemv_geometry on the host).
template <int M>
struct GemvShape {
    static constexpr bool tensor_cores = M >= GEMV_MMA_FROM;
    static constexpr int rows = tensor_cores ? GEMV_MMA_ROWS : GEMV_ROWS;
    static constexpr int pairs = rows / 2;
    static constexpr int warps = tensor_cores ? GEMV_MMA_WARPS : GEMV_WARPS;
    static constexpr int ring_bytes = tensor_cores ? warps * GEMV_MMA_STAGES * GEMV_MMA_ROWS * GEMV_MMA_CHUNK * 2 : 0;
};

// The weight rows a block owns: row r of the block is row `first + r` of w, or, from r = `split`
// on, row `first + half + r - split` (a paired block's second half); rows past `last` (the end of
// a ragged product) read `last` again and are not written. Row numbers are ints: in size_t the
// same arithmetic compiled gemv_m1 to 55 registers instead of 60 and made a batch-1 step 0.7%
// slower in a graph (docs/cuda-backend.md, "Measured design choices").
struct GemvRows {
    const bf16* w;
    int first;
    int half;
    int split;
    int last;
    __device__ __forceinline__ const bf16* row(int r, int k) const {
        return w + (size_t)min(first + (r < split ? r : half + r - split), last) * k;
    }
};

__device__ __forceinline__ void gemv_unpack8(uint4 w, float* out) {
    const unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// Each warp's sums of x[m] · rows[r] over its share of K on CUDA cores, into
// partial[warp][m][r]; returns after a barrier, so any thread may then add them up (gemv_total).
template <int M, int ROWS, int WARPS>
__device__ __forceinline__ void gemv_partials_fma(const bf16* __restrict__ x,
                                                  const GemvRows& block_rows,
                                                  int k,
                                                  float (&partial)[WARPS][M][ROWS]) {
    const bf16* rows[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) rows[r] = block_rows.row(r, k);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    // This warp's share of K, in whole steps.
    const int steps = (k + GEMV_STEP - 1) / GEMV_STEP;
    const int per_warp = (steps + WARPS - 1) / WARPS;
    const int k_begin = warp * per_warp * GEMV_STEP;
    const int k_end = min(k, k_begin + per_warp * GEMV_STEP);

    float acc[M][ROWS];
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.0f;
    }
    // No weight is prefetched into L2 before the wait: in a graph with programmatic launch that
    // made a batch-1 step 8% slower (docs/cuda-backend.md, "Measured design choices"), so the
    // kernel waits for the one that writes x first.
    await_previous_kernels();

    for (int base = k_begin; base < k_end; base += GEMV_UNROLL * GEMV_STEP) {
        uint4 wv[GEMV_UNROLL][ROWS];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int kk = base + u * GEMV_STEP + lane * 8;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                wv[u][r] = kk < k_end ? __ldg(reinterpret_cast<const uint4*>(rows[r] + kk)) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int kk = base + u * GEMV_STEP + lane * 8;
            if (kk >= k_end) continue;
            float wf[ROWS][8];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) gemv_unpack8(wv[u][r], wf[r]);
#pragma unroll
            for (int m = 0; m < M; ++m) {
                float xf[8];
                gemv_unpack8(__ldg(reinterpret_cast<const uint4*>(x + (size_t)m * k + kk)), xf);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(xf[i], wf[r][i], acc[m][r]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float v = warp_sum(acc[m][r]);
            if (lane == 0) partial[warp][m][r] = v;
        }
    }
    __syncthreads();
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// The same sums on tensor cores: each warp multiplies the block's 16 weight rows (the A operand of
// mma.sync m16n8k16) by x's M rows (the 8-column B operand, columns M.. zero) over its share of K,
// in chunks of GEMV_MMA_CHUNK (64) values. The weights stream through the warp's own ring of
// GEMV_MMA_STAGES shared-memory slots (128 bytes of each row per slot, copied with cp.async, a
// load instruction reading whole 128-byte lines), x straight into registers as many chunks ahead:
// the ring holds weights alone, so more of them are in flight per SM (staging x through the ring
// too held a step at 89% of copy bandwidth for 8 rows, this 95%; docs/cuda-backend.md, "Measured
// design choices").
// K is permuted within each 32-value group, the same way for both operands: lane (g, t) takes
// values 8t..8t+7 of the group (one 16-byte word) of weight rows g and g + 8 from the ring and of
// x's row g from global memory, and the words' halves are its fragments for the group's two
// k-steps. The odd rows' 64-byte halves are swapped in a slot, so the 16-byte reads of a
// quarter-warp (rows g and g + 1) hit all 32 banks once; no padding.
template <int M, int ROWS, int WARPS>
__device__ __forceinline__ void gemv_partials_mma(const bf16* __restrict__ x,
                                                  const GemvRows& rows,
                                                  int k,
                                                  float (&partial)[WARPS][M][ROWS]) {
    static_assert(ROWS == 16, "one 16-row tile per block");
    constexpr int chunk = GEMV_MMA_CHUNK;
    constexpr int stages = GEMV_MMA_STAGES;
    constexpr int ahead = stages - 1;                   // chunks in flight while one is used
    constexpr int slot_bytes = ROWS * chunk * 2;
    constexpr int per_lane = ROWS * (chunk / 8) / 32;   // 16-byte pieces a lane copies per chunk
    extern __shared__ __align__(16) unsigned char gemv_dynamic[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int chunks = (k + chunk - 1) / chunk;
    const int per_warp = (chunks + WARPS - 1) / WARPS;
    const int c_begin = min(chunks, warp * per_warp);
    const int count = min(chunks, c_begin + per_warp) - c_begin;
    const unsigned char* ring = gemv_dynamic + (size_t)warp * stages * slot_bytes;
    const unsigned int ring_base = shared_address(ring);
    // This lane's pieces of a chunk: piece p = lane + 32 i is 16-byte piece p % 8 of row p / 8;
    // its source at chunk 0 and its place in a slot, computed once.
    const bf16* source[per_lane];
    unsigned int place[per_lane];
    int column[per_lane];
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        const int p = lane + 32 * i;
        const int r = p / 8, piece = p % 8;
        column[i] = piece * 8;
        source[i] = rows.row(r, k) + column[i];
        place[i] = (unsigned int)(r * 128 + (piece ^ ((r & 1) << 2)) * 16);
    }
    const auto copy_weights = [&](int c, int slot) {
#pragma unroll
        for (int i = 0; i < per_lane; ++i) {
            const bool inside = c * chunk + column[i] < k;
            copy16_async(ring_base + slot * slot_bytes + place[i], source[i] + (inside ? c * chunk : 0), inside);
        }
    };
    const bf16* x_row = x + (size_t)min(g, M - 1) * k + 8 * t;
    const auto load_x = [&](int c, uint4 (&words)[2]) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const bool inside = g < M && c * chunk + 32 * q + 8 * t < k;
            words[q] = inside ? __ldg(reinterpret_cast<const uint4*>(x_row + c * chunk + 32 * q)) : make_uint4(0, 0, 0, 0);
        }
    };
    // Lane (g, t)'s word of row g for group 0 (group 1: the other 64-byte half), and of row g + 8.
    const int read_low = g * 128 + (g & 1) * 64 + 16 * t;
    const int read_high = read_low + 8 * 128;
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    uint4 xw[stages][2];
    // The first chunks' weights do not depend on the previous kernel: their copies start before
    // the wait (in a decode graph, 3-4% off a batch-2 or batch-8 step; docs/cuda-backend.md,
    // "Measured design choices"), x's loads after it. One commit group per chunk.
#pragma unroll
    for (int s = 0; s < ahead; ++s) {
        if (s < count) copy_weights(c_begin + s, s);
        asm volatile("cp.async.commit_group;");
    }
    await_previous_kernels();
#pragma unroll
    for (int s = 0; s < ahead; ++s) {
        if (s < count) load_x(c_begin + s, xw[s]);
    }
    // Unrolled by the ring's length, so slot s and x's words xw[s] are named at compile time.
    for (int j0 = 0; j0 < count; j0 += stages) {
#pragma unroll
        for (int s = 0; s < stages; ++s) {
            const int j = j0 + s;
            if (j >= count) break;
            const int refill = (s + ahead) % stages;  // the slot used one chunk ago
            if (j + ahead < count) {
                copy_weights(c_begin + j + ahead, refill);
                load_x(c_begin + j + ahead, xw[refill]);
            }
            asm volatile("cp.async.commit_group;");
            asm volatile("cp.async.wait_group %0;" ::"n"(ahead) : "memory");
            __syncwarp();
            const unsigned char* slot = ring + s * slot_bytes;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const uint4 low = *reinterpret_cast<const uint4*>(slot + (read_low ^ (q << 6)));
                const uint4 high = *reinterpret_cast<const uint4*>(slot + (read_high ^ (q << 6)));
                const unsigned int first[4] = {low.x, high.x, low.y, high.y};
                mma_bf16(acc[0], first, xw[s][q].x, xw[s][q].y);
                const unsigned int second[4] = {low.z, high.z, low.w, high.w};
                mma_bf16(acc[1], second, xw[s][q].z, xw[s][q].w);
            }
            __syncwarp();
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    // Lane (g, t) holds rows g and g + 8 for columns (rows of x) 2t and 2t + 1.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int m = 2 * t + j;
        if (m < M) {
            partial[warp][m][g] = acc[0][j] + acc[1][j];
            partial[warp][m][g + 8] = acc[0][2 + j] + acc[1][2 + j];
        }
    }
    __syncthreads();
}
#endif

// Each warp's sums over its share of K for the block's rows, on tensor cores where GemvShape
// says so and the device has them, on CUDA cores otherwise; returns after a barrier.
template <int M>
__device__ __forceinline__ void gemv_partials(const bf16* __restrict__ x,
                                              const GemvRows& rows,
                                              int k,
                                              float (&partial)[GemvShape<M>::warps][M][GemvShape<M>::rows]) {
    using Shape = GemvShape<M>;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (Shape::tensor_cores) {
        gemv_partials_mma<M, Shape::rows, Shape::warps>(x, rows, k, partial);
        return;
    }
#endif
    gemv_partials_fma<M, Shape::rows, Shape::warps>(x, rows, k, partial);
}

// x[m] · rows[r] over all of K, from gemv_partials' sums (always added in warp order).
template <int M>
__device__ __forceinline__ float gemv_total(const float (&partial)[GemvShape<M>::warps][M][GemvShape<M>::rows], int m, int r) {
    float total = 0.0f;
#pragma unroll
    for (int wi = 0; wi < GemvShape<M>::warps; ++wi) total += partial[wi][m][r];
    return total;
}

template <int M>
__device__ __forceinline__ void gemv_plain(const bf16* __restrict__ x,
                                           const bf16* __restrict__ w,
                                           float* __restrict__ out,
                                           int n,
                                           int k) {
    constexpr int ROWS = GemvShape<M>::rows;
    __shared__ float partial[GemvShape<M>::warps][M][ROWS];
    const int row0 = blockIdx.x * ROWS;
    gemv_partials<M>(x, GemvRows{w, row0, 0, ROWS, n - 1}, k, partial);
    for (int i = threadIdx.x; i < M * ROWS; i += blockDim.x) {
        const int m = i / ROWS;
        const int r = i % ROWS;
        if (row0 + r < n) out[(size_t)m * n + row0 + r] = gemv_total<M>(partial, m, r);
    }
}

template <int M>
__device__ __forceinline__ void gemv_swiglu(const bf16* __restrict__ x,
                                            const bf16* __restrict__ w,
                                            bf16* __restrict__ out,
                                            int k) {
    constexpr int ROWS = GemvShape<M>::rows;
    constexpr int PAIRS = GemvShape<M>::pairs;
    __shared__ float partial[GemvShape<M>::warps][M][ROWS];
    const int i0 = blockIdx.x * PAIRS;
    gemv_partials<M>(x, GemvRows{w, i0, INTERMEDIATE, PAIRS, 0x7fffffff}, k, partial);
    for (int j = threadIdx.x; j < M * PAIRS; j += blockDim.x) {
        const int m = j / PAIRS;
        const int p = j % PAIRS;
        const float gate = gemv_total<M>(partial, m, p);
        const float up = gemv_total<M>(partial, m, p + PAIRS);
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
                                              kv_t* __restrict__ k_cache,
                                              kv_t* __restrict__ v_cache,
                                              const float* __restrict__ kv_scales,
                                              int k) {
    constexpr int ROWS = GemvShape<M>::rows;
    constexpr int PAIRS = GemvShape<M>::pairs;
    __shared__ float partial[GemvShape<M>::warps][M][ROWS];
    constexpr int blocks_per_head = GEMV_HALF_HEAD / PAIRS;
    const int h = blockIdx.x / blocks_per_head;
    const int d0 = (blockIdx.x % blocks_per_head) * PAIRS;
    gemv_partials<M>(x, GemvRows{w, h * HEAD_DIM + d0, GEMV_HALF_HEAD, PAIRS, 0x7fffffff}, k, partial);
    const bool is_q = h < NUM_Q_HEADS;
    const bool is_v = h >= NUM_Q_HEADS + NUM_KV_HEADS;
    for (int j = threadIdx.x; j < M * PAIRS; j += blockDim.x) {
        const int m = j / PAIRS;
        const int d = d0 + j % PAIRS;
        const int slot = slots[m];
        if (!is_q && slot < 0) continue;
        float lo = gemv_total<M>(partial, m, j % PAIRS);
        float hi = gemv_total<M>(partial, m, j % PAIRS + PAIRS);
#if QKV_BIAS
        lo += bf16_to_f32(bias[h * HEAD_DIM + d]);
        hi += bf16_to_f32(bias[h * HEAD_DIM + d + GEMV_HALF_HEAD]);
#endif
        if (!is_v) rotate_pair((float)positions[m] * inv_freq[d], lo, hi);
#if KV_FP8
        qkv_store(h, m, slot, d, lo, hi, q_out, k_cache, v_cache, kv_scales);
#else
        bf16* dst = qkv_destination(h, m, slot, q_out, k_cache, v_cache);
        dst[d] = f32_to_bf16(lo);
        dst[d + GEMV_HALF_HEAD] = f32_to_bf16(hi);
#endif
    }
}

// The entry points, one line each so every name appears in the source (the host checks that
// every name it loads is defined here). kernels/moe.cu compiles this file for its inner loops
// alone (GEMV_NO_ENTRIES).
#ifndef GEMV_NO_ENTRIES
#define GEMV_PLAIN_PARAMS const bf16 *__restrict__ x, const bf16 *__restrict__ w, float *__restrict__ out, int n, int k
#define GEMV_SWIGLU_PARAMS const bf16 *__restrict__ x, const bf16 *__restrict__ w, bf16 *__restrict__ out, int k
#define GEMV_QKV_ROPE_PARAMS                                                                                   \
    const bf16 *__restrict__ x, const bf16 *__restrict__ w, const bf16 *__restrict__ bias,                     \
        const float *__restrict__ inv_freq, const int *__restrict__ positions, const int *__restrict__ slots, \
        bf16 *__restrict__ q_out, kv_t *__restrict__ k_cache, kv_t *__restrict__ v_cache,                      \
        const float *__restrict__ kv_scales, int k
#define GEMV_QKV_ROPE_ARGS x, w, bias, inv_freq, positions, slots, q_out, k_cache, v_cache, kv_scales, k
#define GEMV_ENTRY(m) extern "C" __global__ void __launch_bounds__(GemvShape<m>::warps * 32)
GEMV_ENTRY(1) gemv_m1(GEMV_PLAIN_PARAMS) { gemv_plain<1>(x, w, out, n, k); }
GEMV_ENTRY(2) gemv_m2(GEMV_PLAIN_PARAMS) { gemv_plain<2>(x, w, out, n, k); }
GEMV_ENTRY(3) gemv_m3(GEMV_PLAIN_PARAMS) { gemv_plain<3>(x, w, out, n, k); }
GEMV_ENTRY(4) gemv_m4(GEMV_PLAIN_PARAMS) { gemv_plain<4>(x, w, out, n, k); }
GEMV_ENTRY(5) gemv_m5(GEMV_PLAIN_PARAMS) { gemv_plain<5>(x, w, out, n, k); }
GEMV_ENTRY(6) gemv_m6(GEMV_PLAIN_PARAMS) { gemv_plain<6>(x, w, out, n, k); }
GEMV_ENTRY(7) gemv_m7(GEMV_PLAIN_PARAMS) { gemv_plain<7>(x, w, out, n, k); }
GEMV_ENTRY(8) gemv_m8(GEMV_PLAIN_PARAMS) { gemv_plain<8>(x, w, out, n, k); }
GEMV_ENTRY(1) gemv_swiglu_m1(GEMV_SWIGLU_PARAMS) { gemv_swiglu<1>(x, w, out, k); }
GEMV_ENTRY(2) gemv_swiglu_m2(GEMV_SWIGLU_PARAMS) { gemv_swiglu<2>(x, w, out, k); }
GEMV_ENTRY(3) gemv_swiglu_m3(GEMV_SWIGLU_PARAMS) { gemv_swiglu<3>(x, w, out, k); }
GEMV_ENTRY(4) gemv_swiglu_m4(GEMV_SWIGLU_PARAMS) { gemv_swiglu<4>(x, w, out, k); }
GEMV_ENTRY(5) gemv_swiglu_m5(GEMV_SWIGLU_PARAMS) { gemv_swiglu<5>(x, w, out, k); }
GEMV_ENTRY(6) gemv_swiglu_m6(GEMV_SWIGLU_PARAMS) { gemv_swiglu<6>(x, w, out, k); }
GEMV_ENTRY(7) gemv_swiglu_m7(GEMV_SWIGLU_PARAMS) { gemv_swiglu<7>(x, w, out, k); }
GEMV_ENTRY(8) gemv_swiglu_m8(GEMV_SWIGLU_PARAMS) { gemv_swiglu<8>(x, w, out, k); }
GEMV_ENTRY(1) gemv_qkv_rope_m1(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<1>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY(2) gemv_qkv_rope_m2(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<2>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY(3) gemv_qkv_rope_m3(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<3>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY(4) gemv_qkv_rope_m4(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<4>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY(5) gemv_qkv_rope_m5(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<5>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY(6) gemv_qkv_rope_m6(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<6>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY(7) gemv_qkv_rope_m7(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<7>(GEMV_QKV_ROPE_ARGS); }
GEMV_ENTRY(8) gemv_qkv_rope_m8(GEMV_QKV_ROPE_PARAMS) { gemv_qkv_rope<8>(GEMV_QKV_ROPE_ARGS); }
#endif
