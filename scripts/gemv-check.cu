// Small-M product kernels (kernels/gemv.cu) against a float64 reference and against cuBLASLt,
// built with nvcc on the GPU machine by scripts/gpu-check.sh (stage "gemv", with Llama-3.1-8B's
// shapes as defines).
//   gemv-check test    every M in 1..8 on shapes with ragged N and K, fresh random data; then the
//                      fused entries (gemv_swiglu_mM, gemv_qkv_rope_mM) against the plain product
//                      followed by kernels/swiglu.cu or kernels/qkv_rope.cu, byte for byte (same
//                      sums, same rounding), padding slots included; exits 1 on a mismatch
//   gemv-check bench   Llama-3.1-8B's decode products for M = 1, 2, 4, 8: the kernel and
//                      cuBLASLt's heuristic choice (bf16 in, fp32 out, as the backend calls it),
//                      weight-read bandwidth as a share of the measured copy bandwidth (several
//                      weight copies cycled so no launch reads them from L2); then each fused
//                      entry against the plain product plus its separate kernel
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "check-common.cuh"

#undef INFINITY
#include "prelude.cuh"
#include "gemv.cu"
#include "swiglu.cu"
#include "qkv_rope.cu"

#define LT(call)                                                                            \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #call, (int)s_);  \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)


// Each entry family indexed by m - 1.
static void (*const GEMV_PLAIN[8])(const bf16*, const bf16*, float*, int, int) = {
    gemv_m1, gemv_m2, gemv_m3, gemv_m4, gemv_m5, gemv_m6, gemv_m7, gemv_m8};
static void (*const GEMV_SWIGLU[8])(const bf16*, const bf16*, bf16*, int) = {
    gemv_swiglu_m1, gemv_swiglu_m2, gemv_swiglu_m3, gemv_swiglu_m4,
    gemv_swiglu_m5, gemv_swiglu_m6, gemv_swiglu_m7, gemv_swiglu_m8};
static void (*const GEMV_QKV_ROPE[8])(const bf16*, const bf16*, const bf16*, const float*, const int*, const int*, bf16*,
                                      kv_t*, kv_t*, const float*, int) = {
    gemv_qkv_rope_m1, gemv_qkv_rope_m2, gemv_qkv_rope_m3, gemv_qkv_rope_m4,
    gemv_qkv_rope_m5, gemv_qkv_rope_m6, gemv_qkv_rope_m7, gemv_qkv_rope_m8};

// The launch geometry of the M-row entries, indexed by m - 1 (GemvShape<M>).
template <int... Ms>
struct GemvShapes {
    static constexpr int rows[8] = {GemvShape<Ms>::rows...};
    static constexpr int threads[8] = {32 * GemvShape<Ms>::warps...};
    static constexpr int ring_bytes[8] = {GemvShape<Ms>::ring_bytes...};
};
using Shapes = GemvShapes<1, 2, 3, 4, 5, 6, 7, 8>;
static int gemv_rows(int m) { return Shapes::rows[m - 1]; }
static int gemv_threads(int m) { return Shapes::threads[m - 1]; }
static int gemv_smem(int m) { return Shapes::ring_bytes[m - 1]; }

// Lets every entry take its ring (above 48 KiB needs the attribute).
static void allow_rings() {
    for (int m = 1; m <= 8; ++m) {
        CHECK(cudaFuncSetAttribute(GEMV_PLAIN[m - 1], cudaFuncAttributeMaxDynamicSharedMemorySize, gemv_smem(m)));
        CHECK(cudaFuncSetAttribute(GEMV_SWIGLU[m - 1], cudaFuncAttributeMaxDynamicSharedMemorySize, gemv_smem(m)));
        CHECK(cudaFuncSetAttribute(GEMV_QKV_ROPE[m - 1], cudaFuncAttributeMaxDynamicSharedMemorySize, gemv_smem(m)));
    }
}

static void gemv(int m, const uint16_t* x, const uint16_t* w, float* out, int n, int k) {
    GEMV_PLAIN[m - 1]<<<(n + gemv_rows(m) - 1) / gemv_rows(m), gemv_threads(m), gemv_smem(m)>>>(x, w, out, n, k);
}

static void gemv_swiglu(int m, const uint16_t* x, const uint16_t* w, uint16_t* out, int k) {
    GEMV_SWIGLU[m - 1]<<<INTERMEDIATE / (gemv_rows(m) / 2), gemv_threads(m), gemv_smem(m)>>>(x, w, out, k);
}

// The caches, q and the per-token inputs of the rope write.
struct RopeTargets {
    const float* inv_freq;
    const int* positions;
    const int* slots;
    uint16_t* q;
    uint16_t* k_cache;
    uint16_t* v_cache;
};

static void gemv_qkv_rope(int m, const uint16_t* x, const uint16_t* w, const RopeTargets& t, int k) {
    GEMV_QKV_ROPE[m - 1]<<<QKV_HEADS * HEAD_DIM / gemv_rows(m), gemv_threads(m), gemv_smem(m)>>>(
        x, w, nullptr, t.inv_freq, t.positions, t.slots, t.q, t.k_cache, t.v_cache, nullptr, k);
}

// The unfused paths the backend takes where cuBLASLt serves a product: the plain product into
// fp32 `scratch`, then the separate kernel.
static void unfused_swiglu(int m, const uint16_t* x, const uint16_t* w, float* scratch, uint16_t* out, int k) {
    gemv(m, x, w, scratch, 2 * INTERMEDIATE, k);
    swiglu<<<dim3((INTERMEDIATE / SWIGLU_VEC + 255) / 256, m), 256>>>(scratch, out);
}

static void unfused_qkv_rope(int m, const uint16_t* x, const uint16_t* w, float* scratch, const RopeTargets& t, int k) {
    gemv(m, x, w, scratch, QKV_HEADS * HEAD_DIM, k);
    qkv_rope_write<<<m, 32 * std::min(QKV_HEADS, 32)>>>(scratch, nullptr, nullptr, nullptr, t.inv_freq, t.positions,
                                                       t.slots, t.q, t.k_cache, t.v_cache, nullptr);
}

// Fused entries against the unfused paths, byte for byte, M = 1..8 at depth k. Returns the number
// of differing outputs.
static int test_fused(int k) {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    const size_t qkv_n = (size_t)QKV_HEADS * HEAD_DIM;
    std::vector<uint16_t> x(8 * (size_t)k), w_gate_up(2 * (size_t)INTERMEDIATE * k), w_qkv(qkv_n * k);
    for (auto& v : x) v = to_bf16(uni(rng));
    for (auto& v : w_gate_up) v = to_bf16(uni(rng));
    for (auto& v : w_qkv) v = to_bf16(uni(rng));
    std::vector<float> inv_freq(HEAD_DIM / 2);
    for (int i = 0; i < HEAD_DIM / 2; ++i) inv_freq[i] = std::pow(500000.0f, -2.0f * i / HEAD_DIM);
    // Eight tokens at scattered positions; token 5's slot marks padding (nothing written).
    std::vector<int> positions = {0, 1, 17, 1000, 4095, 7, 131071, 33}, slots = {3, 40, 0, 77, 12, -1, 95, 64};
    const int cache_slots = 96;
    const size_t cache_len = (size_t)cache_slots * NUM_KV_HEADS * HEAD_DIM;
    uint16_t *dx = upload(x), *dw_gu = upload(w_gate_up), *dw_qkv = upload(w_qkv);
    float *dfreq = upload(inv_freq), *scratch;
    int *dpos = upload(positions), *dslots = upload(slots);
    CHECK(cudaMalloc(&scratch, 8 * 2 * (size_t)INTERMEDIATE * 4));
    uint16_t* outs[2][4];  // [unfused, fused][mlp, q, k cache, v cache]
    const size_t lens[4] = {8 * (size_t)INTERMEDIATE, 8 * (size_t)NUM_Q_HEADS * HEAD_DIM, cache_len, cache_len};
    for (auto& side : outs) {
        for (int b = 0; b < 4; ++b) CHECK(cudaMalloc(&side[b], lens[b] * 2));
    }
    int differing = 0;
    for (int m = 1; m <= 8; ++m) {
        for (auto& side : outs) {
            for (int b = 0; b < 4; ++b) CHECK(cudaMemset(side[b], 0x5a, lens[b] * 2));
        }
        RopeTargets unfused{dfreq, dpos, dslots, outs[0][1], outs[0][2], outs[0][3]};
        RopeTargets fused{dfreq, dpos, dslots, outs[1][1], outs[1][2], outs[1][3]};
        unfused_swiglu(m, dx, dw_gu, scratch, outs[0][0], k);
        gemv_swiglu(m, dx, dw_gu, outs[1][0], k);
        unfused_qkv_rope(m, dx, dw_qkv, scratch, unfused, k);
        gemv_qkv_rope(m, dx, dw_qkv, fused, k);
        const char* names[4] = {"swiglu", "q", "k cache", "v cache"};
        for (int b = 0; b < 4; ++b) {
            const auto want = finish_and_download(outs[0][b], lens[b]);
            const auto got = finish_and_download(outs[1][b], lens[b]);
            int here = 0;
            for (size_t i = 0; i < lens[b]; ++i) here += want[i] != got[i];
            if (here) fprintf(stderr, "MISMATCH fused %s m=%d k=%d: %d of %zu values differ\n", names[b], m, k, here, lens[b]);
            differing += here;
        }
    }
    for (auto& side : outs) {
        for (auto* b : side) CHECK(cudaFree(b));
    }
    for (void* p : {(void*)dx, (void*)dw_gu, (void*)dw_qkv, (void*)dfreq, (void*)scratch, (void*)dpos, (void*)dslots}) CHECK(cudaFree(p));
    return differing;
}

static int test() {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    int failures = 0;
    const int shapes[][2] = {{1, 8}, {5, 264}, {37, 1000}, {130, 4104}, {64, 14336}};
    for (auto& s : shapes) {
        const int n = s[0], k = s[1];
        std::vector<uint16_t> x(8 * (size_t)k), w((size_t)n * k);
        for (auto& v : x) v = to_bf16(uni(rng));
        for (auto& v : w) v = to_bf16(uni(rng));
        uint16_t *dx, *dw;
        float* dout;
        CHECK(cudaMalloc(&dx, x.size() * 2));
        CHECK(cudaMalloc(&dw, w.size() * 2));
        CHECK(cudaMalloc(&dout, 8 * (size_t)n * 4));
        CHECK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
        for (int m = 1; m <= 8; ++m) {
            CHECK(cudaMemset(dout, 0xff, 8 * (size_t)n * 4));
            gemv(m, dx, dw, dout, n, k);
            CHECK(cudaGetLastError());
            std::vector<float> out((size_t)m * n);
            CHECK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < m; ++i) {
                for (int j = 0; j < n; ++j) {
                    double ref = 0.0;
                    for (int c = 0; c < k; ++c) ref += (double)from_bf16(x[(size_t)i * k + c]) * from_bf16(w[(size_t)j * k + c]);
                    const double err = std::fabs(out[(size_t)i * n + j] - ref);
                    if (!(err <= 1e-4 * std::sqrt((double)k) + 1e-5 * std::fabs(ref))) {
                        if (failures < 10) fprintf(stderr, "MISMATCH m=%d n=%d k=%d at (%d,%d): %g vs %g\n", m, n, k, i, j, out[(size_t)i * n + j], ref);
                        ++failures;
                    }
                }
            }
        }
        CHECK(cudaFree(dx));
        CHECK(cudaFree(dw));
        CHECK(cudaFree(dout));
    }
    printf("RESULT gemv test (M 1..8, 5 shapes): %s (%d mismatches)\n", failures ? "FAIL" : "ok", failures);
    int fused_differing = 0;
    for (int k : {64, 264}) fused_differing += test_fused(k);
    printf("RESULT gemv fused test (swiglu and qkv rope write against the unfused kernels, M 1..8, K 64 and 264): %s (%d values differ)\n",
           fused_differing ? "FAIL" : "ok", fused_differing);
    return failures || fused_differing ? 1 : 0;
}


// Microseconds per call of run(i) for i = 0, 1, ...: `copies` + 2 warm-up calls (every weight
// copy once), then at least 20 and at least two passes over the copies, timed with events.
template <typename Run>
static double us_per_launch(Run run, int copies) {
    for (int i = 0; i < copies + 2; ++i) run(i);
    CHECK(cudaGetLastError());
    const int iters = std::max(20, 2 * copies);
    StreamTimer timer;
    for (int i = 0; i < iters; ++i) run(i);
    return timer.seconds() * 1e6 / iters;
}

static int bench() {
    const double copy_bw = copy_bandwidth();

    cublasLtHandle_t lt;
    LT(cublasLtCreate(&lt));
    void* workspace;
    const size_t ws_bytes = 32 << 20;
    CHECK(cudaMalloc(&workspace, ws_bytes));
    struct Shape { const char* name; int n, k; };
    const Shape shapes[] = {{"qkv", 6144, 4096}, {"q", 4096, 4096}, {"k|v", 1024, 4096}, {"o", 4096, 4096},
                            {"gate_up", 28672, 4096}, {"gate|up", 14336, 4096}, {"down", 4096, 14336}, {"lm_head", 128256, 4096}};
    uint16_t* x;
    float* out;
    CHECK(cudaMalloc(&x, 8 * 14336 * 2));
    CHECK(cudaMalloc(&out, 8 * (size_t)128256 * 4));
    fill_random<<<64, 256>>>(x, 8 * 14336, 9, 118);
    double total_gemv[9] = {0}, total_lt[9] = {0}, total_best[9] = {0}, total_bytes = 0;
    for (const Shape& s : shapes) {
        const size_t wbytes = (size_t)s.n * s.k * 2;
        const int copies = (int)std::max<size_t>(1, (size_t)(512u << 20) / wbytes + 1);
        uint16_t* w;
        CHECK(cudaMalloc(&w, wbytes * copies));
        fill_random<<<4096, 256>>>(w, wbytes / 2 * copies, 11, 118);
        for (int m : {1, 2, 4, 8}) {
            // cuBLASLt as the backend plans it: D[n, m] = W^T(k x n, transposed) * X(k x m), fp32 out.
            cublasLtMatmulDesc_t desc;
            LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t trans = CUBLAS_OP_T;
            LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
            cublasLtMatrixLayout_t la, lb, ld;
            LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
            LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, m, s.k));
            LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, s.n, m, s.n));
            cublasLtMatmulPreference_t pref;
            LT(cublasLtMatmulPreferenceCreate(&pref));
            const uint64_t ws = ws_bytes;
            LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
            cublasLtMatmulHeuristicResult_t heur;
            int found = 0;
            LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
            const float alpha = 1.0f, beta = 0.0f;
            auto run_lt = [&](int i) {
                LT(cublasLtMatmul(lt, desc, &alpha, w + (size_t)(i % copies) * s.n * s.k, la, x, lb, &beta, out, ld, out, ld,
                                  &heur.algo, workspace, ws_bytes, 0));
            };
            auto run_gemv = [&](int i) { gemv(m, x, w + (size_t)(i % copies) * s.n * s.k, out, s.n, s.k); };
            const double us[2] = {us_per_launch(run_gemv, copies), us_per_launch(run_lt, copies)};
            printf("RESULT gemv bench %-8s n=%-6d k=%-5d m=%d: kernel %.1f us (%.0f%% of copy), cuBLASLt %.1f us (%.0f%%)\n",
                   s.name, s.n, s.k, m, us[0], 100.0 * wbytes / (us[0] * 1e-6) / copy_bw, us[1],
                   100.0 * wbytes / (us[1] * 1e-6) / copy_bw);
            fflush(stdout);
            // Per-token totals over a layer's products (fused qkv and gate_up) and the LM head.
            if (!strcmp(s.name, "qkv") || !strcmp(s.name, "o") || !strcmp(s.name, "gate_up") || !strcmp(s.name, "down")) {
                total_gemv[m] += 32 * us[0];
                total_lt[m] += 32 * us[1];
                total_best[m] += 32 * std::min(us[0], us[1]);
                if (m == 1) total_bytes += 32.0 * wbytes;
            } else if (!strcmp(s.name, "lm_head")) {
                total_gemv[m] += us[0];
                total_lt[m] += us[1];
                total_best[m] += std::min(us[0], us[1]);
                if (m == 1) total_bytes += wbytes;
            }
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(ld);
            cublasLtMatmulDescDestroy(desc);
        }
        CHECK(cudaFree(w));
    }
    // Each fused entry against the plain product plus its separate kernel, on the 8B shapes.
    {
        const int k = 4096;
        const size_t qkv_n = (size_t)QKV_HEADS * HEAD_DIM;
        const size_t gu_bytes = 2 * (size_t)INTERMEDIATE * k * 2, qkv_bytes = qkv_n * k * 2;
        const int copies = (int)((512u << 20) / gu_bytes + 1);
        uint16_t *w_gu, *w_qkv, *mlp, *q, *kc, *vc;
        float* freq;
        int *pos, *slots;
        CHECK(cudaMalloc(&w_gu, gu_bytes * copies));
        CHECK(cudaMalloc(&w_qkv, qkv_bytes * copies));
        fill_random<<<4096, 256>>>(w_gu, gu_bytes / 2 * copies, 13, 118);
        fill_random<<<4096, 256>>>(w_qkv, qkv_bytes / 2 * copies, 17, 118);
        CHECK(cudaMalloc(&mlp, 8 * (size_t)INTERMEDIATE * 2));
        CHECK(cudaMalloc(&q, 8 * (size_t)NUM_Q_HEADS * HEAD_DIM * 2));
        CHECK(cudaMalloc(&kc, 64 * (size_t)NUM_KV_HEADS * HEAD_DIM * 2));
        CHECK(cudaMalloc(&vc, 64 * (size_t)NUM_KV_HEADS * HEAD_DIM * 2));
        std::vector<float> inv_freq(HEAD_DIM / 2, 0.01f);
        std::vector<int> positions = {5, 6, 7, 8, 9, 10, 11, 12}, slot_list = {0, 1, 2, 3, 4, 5, 6, 7};
        freq = upload(inv_freq);
        pos = upload(positions);
        slots = upload(slot_list);
        const RopeTargets t{freq, pos, slots, q, kc, vc};
        for (int m : {1, 8}) {
            const auto gu = [&](int i) { return w_gu + (size_t)(i % copies) * 2 * INTERMEDIATE * k; };
            const auto qw = [&](int i) { return w_qkv + (size_t)(i % copies) * qkv_n * k; };
            const double us[4] = {
                us_per_launch([&](int i) { unfused_swiglu(m, x, gu(i), out, mlp, k); }, copies),
                us_per_launch([&](int i) { gemv_swiglu(m, x, gu(i), mlp, k); }, copies),
                us_per_launch([&](int i) { unfused_qkv_rope(m, x, qw(i), out, t, k); }, copies),
                us_per_launch([&](int i) { gemv_qkv_rope(m, x, qw(i), t, k); }, copies),
            };
            printf("RESULT gemv fused bench m=%d: gate_up + swiglu %.1f us, gemv_swiglu %.1f us; qkv + rope write %.1f us, gemv_qkv_rope %.1f us\n",
                   m, us[0], us[1], us[2], us[3]);
        }
        for (void* p : {(void*)w_gu, (void*)w_qkv, (void*)mlp, (void*)q, (void*)kc, (void*)vc, (void*)freq, (void*)pos, (void*)slots}) CHECK(cudaFree(p));
    }
    for (int m : {1, 2, 4, 8}) {
        printf("RESULT gemv 8B products per step m=%d (32 layers fused qkv, o, gate_up, down + lm_head, %.2f GB): kernel %.2f ms, cuBLASLt %.2f ms, best per shape %.2f ms = %.0f%% of the weight-read floor %.2f ms\n",
               m, total_bytes / 1e9, total_gemv[m] / 1e3, total_lt[m] / 1e3, total_best[m] / 1e3,
               100.0 * (total_bytes / copy_bw * 1e3) / (total_best[m] / 1e3), total_bytes / copy_bw * 1e3);
    }
    return 0;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "test";
    allow_rings();
    return !strcmp(mode, "bench") ? bench() : test();
}
