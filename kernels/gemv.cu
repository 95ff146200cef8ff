// Small-M products for decode: out[m][n] = sum_k x[m][k] * w[n][k] for M <= 8 rows of x (bf16)
// against a row-major weight w [N, K] (bf16), written as fp32 [M, N] like the cuBLASLt path.
//
// gemv_mM (M = 1..8): grid ceil(N / GEMV_ROWS), GEMV_WARPS warps per block (GEMV_ROWS and
// GEMV_WARPS come from the host, src/backend/cuda/plan.rs). A block owns
// GEMV_ROWS consecutive weight rows and splits K over its warps (split-K inside the block, so no
// atomics and no second pass); each lane reads 16 bytes (8 values) of every owned row per step,
// GEMV_UNROLL steps in flight, and reuses each 16-byte slice of x for all owned rows. Warps merge
// their partial sums in shared memory. K must be a multiple of 8 (the host checks).

#define GEMV_UNROLL 2
#define GEMV_STEP (32 * 8)

__device__ __forceinline__ void gemv_unpack8(uint4 w, float* out) {
    const unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

template <int M>
__device__ __forceinline__ void gemv_body(const bf16* __restrict__ x,
                                          const bf16* __restrict__ w,
                                          float* __restrict__ out,
                                          int n,
                                          int k) {
    __shared__ float partial[GEMV_WARPS][M][GEMV_ROWS];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * GEMV_ROWS;
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
    const bf16* rows[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) rows[r] = w + (size_t)min(row0 + r, n - 1) * k;
    // The weights are constant: start pulling this warp's first slices into L2 while the kernel
    // that writes x may still be running, then wait for it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
        const int kk = k_begin + u * GEMV_STEP + lane * 8;
        if (kk < k_end) {
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) asm volatile("prefetch.global.L2 [%0];" ::"l"(rows[r] + kk));
        }
    }
#endif
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
    for (int i = threadIdx.x; i < M * GEMV_ROWS; i += blockDim.x) {
        const int m = i / GEMV_ROWS;
        const int r = i % GEMV_ROWS;
        if (row0 + r >= n) continue;
        float total = 0.0f;
#pragma unroll
        for (int wi = 0; wi < GEMV_WARPS; ++wi) total += partial[wi][m][r];
        out[(size_t)m * n + row0 + r] = total;
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m1(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<1>(x, w, out, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m2(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<2>(x, w, out, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m3(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<3>(x, w, out, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m4(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<4>(x, w, out, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m5(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<5>(x, w, out, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m6(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<6>(x, w, out, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m7(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<7>(x, w, out, n, k);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_m8(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int n, int k) {
    gemv_body<8>(x, w, out, n, k);
}

// gemv_mma: the same product for M <= 8 on tensor cores, for K a multiple of 32 (the host
// checks). One block owns GEMV_MMA_ROWS = 16 weight rows and splits K over its GEMV_MMA_WARPS warps;
// each warp runs mma.sync m16n8k16 (bf16 in, fp32 accumulate) with the weight tile as operand A
// and x transposed as operand B (its 8 columns are the rows of x, those past M zero).
// Within every 32 values of K, lane (g = lane / 4, t = lane % 4) loads the 8 consecutive values
// 8t..8t+7 of weight rows g and g + 8 and of x row g with 16-byte loads; the two mma's of those
// 32 values take the first and last four of them as the K slots {2t, 2t+1, 2t+8, 2t+9} the
// fragment layout gives the lane. That permutes K alike in both operands, so the sum is the same
// and every load is whole. Warps merge their tiles in shared memory.
#if GEMV_MMA_ROWS != 16
#error "GEMV_MMA_ROWS must be 16, the M of mma.m16n8k16"
#endif
#define MMA_UNROLL 4

__device__ __forceinline__ void mma_16816_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(GEMV_MMA_WARPS * 32)
gemv_mma(const bf16* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int m, int n,
         int k) {
    __shared__ float partial[GEMV_MMA_WARPS][GEMV_MMA_ROWS][8];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int row0 = blockIdx.x * GEMV_MMA_ROWS;
    const bf16* w_lo = w + (size_t)min(row0 + g, n - 1) * k + 8 * t;
    const bf16* w_hi = w + (size_t)min(row0 + g + 8, n - 1) * k + 8 * t;
    const bool has_x = g < m;
    const bf16* x_row = x + (size_t)(has_x ? g : 0) * k + 8 * t;
    // This warp's share of K, in chunks of 32.
    const int chunks = k / 32;
    const int per_warp = (chunks + GEMV_MMA_WARPS - 1) / GEMV_MMA_WARPS;
    const int c_begin = warp * per_warp;
    const int c_end = min(chunks, c_begin + per_warp);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The weights are constant: start pulling the first chunks into L2 while the kernel that
    // writes x may still be running.
#pragma unroll
    for (int u = 0; u < MMA_UNROLL; ++u) {
        if (c_begin + u < c_end) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w_lo + (c_begin + u) * 32));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w_hi + (c_begin + u) * 32));
        }
    }
#endif
    await_previous_kernels();

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int c = c_begin; c < c_end; c += MMA_UNROLL) {
        uint4 lo[MMA_UNROLL], hi[MMA_UNROLL], xv[MMA_UNROLL];
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; ++u) {
            const bool in = c + u < c_end;
            const int at = (c + u) * 32;
            lo[u] = in ? __ldg(reinterpret_cast<const uint4*>(w_lo + at)) : zero;
            hi[u] = in ? __ldg(reinterpret_cast<const uint4*>(w_hi + at)) : zero;
            xv[u] = in && has_x ? __ldg(reinterpret_cast<const uint4*>(x_row + at)) : zero;
        }
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; ++u) {
            mma_16816_bf16(acc, lo[u].x, hi[u].x, lo[u].y, hi[u].y, xv[u].x, xv[u].y);
            mma_16816_bf16(acc, lo[u].z, hi[u].z, lo[u].w, hi[u].w, xv[u].z, xv[u].w);
        }
    }
    // Accumulator fragment: acc[0..1] are weight row g, x rows 2t and 2t + 1; acc[2..3] row g + 8.
    partial[warp][g][2 * t] = acc[0];
    partial[warp][g][2 * t + 1] = acc[1];
    partial[warp][g + 8][2 * t] = acc[2];
    partial[warp][g + 8][2 * t + 1] = acc[3];
    __syncthreads();
    for (int i = threadIdx.x; i < 8 * GEMV_MMA_ROWS; i += blockDim.x) {
        const int mm = i / GEMV_MMA_ROWS;
        const int r = i % GEMV_MMA_ROWS;
        if (mm >= m || row0 + r >= n) continue;
        float total = 0.0f;
#pragma unroll
        for (int wi = 0; wi < GEMV_MMA_WARPS; ++wi) total += partial[wi][r][mm];
        out[(size_t)mm * n + row0 + r] = total;
    }
}
