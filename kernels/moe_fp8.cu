// FP8 experts (src/backend/cuda/moe.rs, Fp8Experts): the grouped products of kernels/moe.cu over
// experts kept in E4M3 with f32 scales. Compiled in the moe.cu family, after kernels/fp8.cu (its
// E4M3 conversions and small-M inner loop, FP8_NO_ENTRIES) and kernels/moe.cu (the permutation's
// `meta`, the chunk loop and the tensor-core tile). NOT YET RUN ON A GPU (written without one;
// scripts/moe-fp8-check.cu and tests/cuda_moe.rs check it on the device).
//
// On the device, one projection of every expert is [MOE_EXPERTS, N, K] E4M3 bytes and [MOE_EXPERTS,
// N, groups] f32 scales (src/backend/cuda/fp8.rs's layout per expert: one scale per row, or per row
// and block of `group` columns). The gate/up projection's rows are in groups of 4: gate rows 2i
// and 2i + 1, then up rows 2i and 2i + 1, so fp8.cu's plain row groups of 4 hold two whole pairs
// of the SwiGLU. K (HIDDEN, MOE_INTER) is a multiple of 16.
//
// A step runs kernels/moe.cu's routing, permutation and gather (also for one token: the FP8
// products read gathered rows), then:
//   moe_fp8_round        the permuted rows rounded in place as the experts' input scheme says
//                        (src/model/fp8.rs, ActivationScale): per row's largest magnitude (capped
//                        where the checkpoint says), per row and group, or by the row's expert's
//                        static input scale; each value becomes bf16(e4m3(v / s) * s), the value
//                        fp8_quantize_input's `xd` holds. Not launched for weight-only FP8;
//   moe_fp8_gate_up      grid (MOE_INTER / 2 / row groups per block, active experts): expert j's
//                        segment against its gate/up rows through fp8.cu's small-M loop in chunks
//                        of up to 8 rows (weights read once per chunk, widened in registers),
//                        SwiGLU applied, [rows, MOE_INTER] bf16;
//   moe_fp8_down         grid (HIDDEN / rows per block, active experts): the same for the down
//                        projection, [rows, HIDDEN] fp32;
//   moe_fp8_gemm_gate_up, the same two products for many rows per expert (prefill): moe.cu's
//   moe_fp8_gemm_down    tensor-core tiles with B widened from E4M3 to bf16 as it is loaded;
// then moe_combine as for bf16 experts.

// The most threads of moe_fp8_round's blocks (the host launches a multiple of 32 covering the group
// once, at most these: at decode one block per row is the whole launch).
#define MOE_FP8_ROUND_THREADS 1024

// Rounds row blockIdx.x of `rows` ([T * MOE_TOP_K, width] bf16), group blockIdx.y (`group` columns;
// 0: the whole row), in place. static_scales (null: dynamic) holds each expert's input scale; a
// dynamic scale is the group's largest magnitude (capped at upper_bound when it is positive) over
// 448, at least FP8_MIN_SCALE. Grid (T * MOE_TOP_K, groups), at most MOE_FP8_ROUND_THREADS threads;
// rows past the step's return at once.
extern "C" __global__ void __launch_bounds__(MOE_FP8_ROUND_THREADS)
    moe_fp8_round(bf16* __restrict__ rows, int width, int group, float upper_bound,
                  const float* __restrict__ static_scales, const int* __restrict__ meta) {
    __shared__ float scratch[32];
    await_previous_kernels();
    const int r = blockIdx.x;
    if (r >= meta[MOE_EXPERTS]) return;
    const int span = group > 0 ? group : width;
    const int first = blockIdx.y * span;
    const int last = min(first + span, width);
    bf16* row = rows + (size_t)r * width;
    float scale;
    if (static_scales != nullptr) {
        // The row's expert: the last e whose segment starts at or before r (an empty segment
        // there would be followed by one starting at the same row).
        int lo = 0, hi = MOE_EXPERTS - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (meta[mid] <= r) lo = mid; else hi = mid - 1;
        }
        scale = static_scales[lo];
    } else {
        float amax = 0.0f;
        for (int i = first + threadIdx.x; i < last; i += blockDim.x) amax = fmaxf(amax, fabsf(bf16_to_f32(row[i])));
        amax = fp8_block_max(amax, scratch);
        if (upper_bound > 0.0f) amax = fminf(amax, upper_bound);
        scale = fmaxf(amax / FP8_MAX, FP8_MIN_SCALE);
    }
    // Each thread rewrites the values it read (the maximum's barriers separate reads from writes).
    for (int i = first + threadIdx.x; i < last; i += blockDim.x) {
        const unsigned int code = f32_to_e4m3(bf16_to_f32(row[i]) / scale);
        row[i] = f32_to_bf16(e4m3_to_f32(code) * scale);
    }
}

// `M` permuted rows at x (HIDDEN apart) against one expert's gate/up rows `w` (the groups of 4
// above) with their `scales`: the block's row groups of 4 (two SwiGLU pairs each), SwiGLU applied,
// into out's columns 2g and 2g + 1 of row group g.
template <int M>
__device__ __forceinline__ void moe_fp8_swiglu_rows(const bf16* __restrict__ x, const e4m3* __restrict__ w,
                                                    const float* __restrict__ scales, bf16* __restrict__ out,
                                                    int groups, int group, int splits) {
    __shared__ float partial[FP8_GEMV_MAX_WARPS][M][4];
    fp8_gemv_partials<M, 4, FP8_PLAIN>(x, w, scales, 2 * MOE_INTER, HIDDEN, groups, group, splits, partial);
    const int row_groups = (blockDim.x >> 5) / splits;
    for (int t = threadIdx.x; t < row_groups * M * 2; t += blockDim.x) {
        const int local = t / (M * 2);
        const int m = (t / 2) % M;
        const int p = t % 2;
        const int g = blockIdx.x * row_groups + local;
        if (g >= MOE_INTER / 2) continue;
        const int gate_row = 4 * g + p;
        const float gate = fp8_gemv_total<M, 4, FP8_PLAIN>(partial, local, m, p, gate_row, scales, groups, splits);
        const float up =
            fp8_gemv_total<M, 4, FP8_PLAIN>(partial, local, m, p + 2, gate_row + 2, scales, groups, splits);
        out[(size_t)m * MOE_INTER + 2 * g + p] = f32_to_bf16(silu_times(gate, up));
    }
}

// The small-M entries: blocks of FP8_GEMV_MAX_WARPS warps at most (src/backend/cuda/fp8.rs,
// GemvGeometry: rows of 4), blockIdx.y the index among the experts with rows (those past their
// count return at once). The weights' addresses depend on `meta`, so the kernels wait for the
// previous one before any load.
extern "C" __global__ void __launch_bounds__(FP8_GEMV_MAX_WARPS * 32)
    moe_fp8_gate_up(const bf16* __restrict__ x_perm, const e4m3* __restrict__ w, const float* __restrict__ scales,
                    const int* __restrict__ meta, bf16* __restrict__ h_perm, int groups, int group, int splits) {
    await_previous_kernels();
    if ((int)blockIdx.y >= meta[MOE_META_COUNT]) return;
    const int e = meta[MOE_META_ACTIVE + blockIdx.y];
    const int begin = meta[e];
    const int end = meta[e + 1];
    const e4m3* we = w + (size_t)e * 2 * MOE_INTER * HIDDEN;
    const float* se = scales + (size_t)e * 2 * MOE_INTER * groups;
#define MOE_FP8_GATE_UP(M) \
    moe_fp8_swiglu_rows<M>(x_perm + (size_t)r * HIDDEN, we, se, h_perm + (size_t)r * MOE_INTER, groups, group, splits)
    MOE_CHUNKS(MOE_FP8_GATE_UP)
#undef MOE_FP8_GATE_UP
}

extern "C" __global__ void __launch_bounds__(FP8_GEMV_MAX_WARPS * 32)
    moe_fp8_down(const bf16* __restrict__ h_perm, const e4m3* __restrict__ w, const float* __restrict__ scales,
                 const int* __restrict__ meta, float* __restrict__ y_perm, int groups, int group, int splits) {
    await_previous_kernels();
    if ((int)blockIdx.y >= meta[MOE_META_COUNT]) return;
    const int e = meta[MOE_META_ACTIVE + blockIdx.y];
    const int begin = meta[e];
    const int end = meta[e + 1];
    const e4m3* we = w + (size_t)e * HIDDEN * MOE_INTER;
    const float* se = scales + (size_t)e * HIDDEN * groups;
#define MOE_FP8_DOWN(M)                                                                                       \
    fp8_gemv<M, 4>(h_perm + (size_t)r * MOE_INTER, we, se, y_perm + (size_t)r * HIDDEN, HIDDEN, MOE_INTER, groups, \
                   group, splits)
    MOE_CHUNKS(MOE_FP8_DOWN)
#undef MOE_FP8_DOWN
}

// The tensor-core entries (128 threads; grid as moe_gemm_gate_up's and moe_gemm_down's).
extern "C" __global__ void __launch_bounds__(128)
    moe_fp8_gemm_gate_up(const bf16* __restrict__ x_perm, const e4m3* __restrict__ w,
                         const float* __restrict__ scales, const int* __restrict__ meta, bf16* __restrict__ h_perm,
                         int groups, int group) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<true, MOE_B_FP8, false>(x_perm, HIDDEN, MoeTileWeights{w, scales, groups, group, nullptr}, meta, h_perm,
                                          MOE_INTER, HIDDEN);
#endif
}

extern "C" __global__ void __launch_bounds__(128)
    moe_fp8_gemm_down(const bf16* __restrict__ h_perm, const e4m3* __restrict__ w, const float* __restrict__ scales,
                      const int* __restrict__ meta, float* __restrict__ y_perm, int groups, int group) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<false, MOE_B_FP8, false>(h_perm, MOE_INTER, MoeTileWeights{w, scales, groups, group, nullptr}, meta,
                                           y_perm, HIDDEN, MOE_INTER);
#endif
}
