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
