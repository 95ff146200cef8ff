// The FP8 kernels (kernels/fp8.cu) alone, built with nvcc on the GPU machine by
// scripts/gpu-check.sh (stage "fp8", with Llama-3.1-8B's shapes as defines).
//   fp8-check test    fp8_quantize_input against a host reference of the same rounding (every
//                     code and scale exact, per token, per 128-column group, capped, static),
//                     fp8_swiglu_quantize against SwiGLU then fp8_quantize_input and
//                     fp8_add_rmsnorm on an unscaled product against fp8_scale_output first (bit
//                     for bit), then
//                     fp8_gemv_mM / fp8_gemv_r4_mM for every M in 1..8 and every launch geometry,
//                     and fp8_dequantize_weight, against a float64 reference on ragged shapes
//                     with per-row and per-group scales; exits 1 on a mismatch
//   fp8-check bench   Llama-3.1-8B's decode products for M = 1, 2, 4, 8 in every launch geometry of
//                     fp8_gemv_mM / fp8_gemv_r4_mM: weight-read bandwidth as a share of the
//                     measured copy bandwidth (several weight copies cycled so no launch reads
//                     them from L2), and the best geometry per shape and M
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
#include "fp8.cu"

// The host's rounding (src/backend/cuda/fp8.rs, f32_to_e4m3_fast).
static uint8_t host_e4m3(float x) {
    if (std::isnan(x)) return 0x7f;
    uint32_t bits;
    memcpy(&bits, &x, 4);
    const uint8_t sign = (bits >> 24) & 0x80;
    const float a = std::fabs(x);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0.015625f) return sign | (uint8_t)std::nearbyint(a * 512.0f);
    memcpy(&bits, &a, 4);
    const uint32_t mantissa = (bits >> 20) & 7, rest = bits & 0xfffff;
    uint32_t code = (((bits >> 23) - 120) << 3) | mantissa;
    if (rest > 0x80000 || (rest == 0x80000 && (mantissa & 1))) code += 1;
    return sign | (uint8_t)code;
}

static double host_value(uint8_t code) {
    const int e = (code >> 3) & 15, m = code & 7;
    const double magnitude = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
    return code & 0x80 ? -magnitude : magnitude;
}

// A launch geometry of the small-M kernels (src/backend/cuda/fp8.rs, GemvGeometry): weight rows
// per row group (2: fp8_gemv_mM, 4: fp8_gemv_r4_mM), warps per block, warps splitting K per row
// group.
struct Geometry { int rows, warps, splits; };

// Every geometry the kernels take: rows 2 or 4, 4 or 8 warps, 1 to 8 splits dividing the warps.
static std::vector<Geometry> geometries() {
    std::vector<Geometry> all;
    for (const int rows : {2, 4})
        for (const int warps : {4, 8})
            for (const int splits : {1, 2, 4, 8})
                if (splits <= warps) all.push_back({rows, warps, splits});
    return all;
}

static void gemv_any(const Geometry& g, int m, const uint16_t* x, const uint8_t* w, const float* s, float* out, int n,
                     int k, int groups, int group, cudaStream_t stream = 0) {
    const int per_block = g.rows * g.warps / g.splits;
    const int blocks = (n + per_block - 1) / per_block;
    const int threads = g.warps * 32;
#define CASE(r, name, mm) \
    if (g.rows == r && m == mm) name<<<blocks, threads, 0, stream>>>(x, w, s, out, n, k, groups, group, g.splits);
    CASE(2, fp8_gemv_m1, 1) CASE(2, fp8_gemv_m2, 2) CASE(2, fp8_gemv_m3, 3) CASE(2, fp8_gemv_m4, 4)
    CASE(2, fp8_gemv_m5, 5) CASE(2, fp8_gemv_m6, 6) CASE(2, fp8_gemv_m7, 7) CASE(2, fp8_gemv_m8, 8)
    CASE(4, fp8_gemv_r4_m1, 1) CASE(4, fp8_gemv_r4_m2, 2) CASE(4, fp8_gemv_r4_m3, 3) CASE(4, fp8_gemv_r4_m4, 4)
    CASE(4, fp8_gemv_r4_m5, 5) CASE(4, fp8_gemv_r4_m6, 6) CASE(4, fp8_gemv_r4_m7, 7) CASE(4, fp8_gemv_r4_m8, 8)
#undef CASE
}

// kernels/swiglu.cu's arithmetic (bf16 out) on the device, the input fp8_swiglu_quantize's
// reference quantizes with fp8_quantize_input.
__global__ void swiglu_reference(const float* gate_up, uint16_t* out) {
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < INTERMEDIATE; i += blockDim.x)
        out[(size_t)t * INTERMEDIATE + i] =
            f32_to_bf16(silu_times(gate_up[(size_t)t * 2 * INTERMEDIATE + i], gate_up[(size_t)t * 2 * INTERMEDIATE + INTERMEDIATE + i]));
}

static int test() {
    std::mt19937 rng(43);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int failures = 0;
    // The input quantization: per token, per 128-column group, capped, static.
    const int t = 5, k = 384;
    std::vector<uint16_t> x(t * k);
    for (auto& v : x) v = to_bf16(normal(rng) * (rng() % 4 == 0 ? 30.0f : 1.0f));
    x[3] = to_bf16(0.0f);
    const uint16_t* dx = upload(x);
    struct Case { int group; float ub, fixed; const char* name; };
    for (const Case c : {Case{0, 0, 0, "per token"}, Case{128, 0, 0, "per group"}, Case{0, 20.0f, 0, "capped"},
                         Case{0, 0, 0.07f, "static"}}) {
        const int groups = c.group ? k / c.group : 1;
        uint8_t* q; uint16_t* d; float* s;
        CHECK(cudaMalloc(&q, t * k)); CHECK(cudaMalloc(&d, t * k * 2)); CHECK(cudaMalloc(&s, t * groups * 4));
        fp8_quantize_input<<<dim3(t, groups), c.group ? c.group : 384>>>(dx, k, c.group, c.ub, c.fixed, q, d, s);
        const auto codes = finish_and_download(q, t * k);
        const auto deq = finish_and_download(d, t * k);
        const auto scales = finish_and_download(s, t * groups);
        int bad = 0;
        for (int r = 0; r < t; ++r)
            for (int g = 0; g < groups; ++g) {
                const int width = k / groups;
                float amax = 0;
                for (int i = g * width; i < (g + 1) * width; ++i) amax = std::max(amax, std::fabs(from_bf16(x[r * k + i])));
                if (c.ub > 0) amax = std::min(amax, c.ub);
                const float scale = c.fixed > 0 ? c.fixed : std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
                if (scales[r * groups + g] != scale) ++bad;
                for (int i = g * width; i < (g + 1) * width; ++i) {
                    const uint8_t want = host_e4m3(from_bf16(x[r * k + i]) / scale);
                    if (codes[r * k + i] != want || deq[r * k + i] != to_bf16((float)host_value(want) * scale)) ++bad;
                }
            }
        printf("RESULT quantize %s: %d mismatches\n", c.name, bad);
        failures += bad;
        CHECK(cudaFree(q)); CHECK(cudaFree(d)); CHECK(cudaFree(s));
    }
    // SwiGLU quantizing its own output (fp8_swiglu_quantize) against SwiGLU then
    // fp8_quantize_input: every code, value and scale the same, per token and per group; and
    // scaling an unscaled product of the codes itself against fp8_scale_output first.
    for (const bool unscaled : {false, true}) {
        const int tokens = 3;
        std::vector<float> gu((size_t)tokens * 2 * INTERMEDIATE);
        for (auto& v : gu) v = normal(rng) * (rng() % 8 == 0 ? 12.0f : 2.0f);
        std::vector<float> xs(tokens), ws(2 * INTERMEDIATE);
        for (auto& v : xs) v = 0.01f + (rng() % 100) * 1e-3f;
        for (auto& v : ws) v = 0.02f + (rng() % 100) * 1e-3f;
        const float* dgu = upload(gu);
        const float* dws = upload(ws);
        float* scaled; CHECK(cudaMalloc(&scaled, gu.size() * 4));
        CHECK(cudaMemcpy(scaled, dgu, gu.size() * 4, cudaMemcpyDeviceToDevice));
        if (unscaled) {
            const float* dxs = upload(xs);
            fp8_scale_output<<<64, 256>>>(scaled, dxs, dws, tokens, 2 * INTERMEDIATE);
            CHECK(cudaFree((void*)dxs));
        }
        uint16_t* y; CHECK(cudaMalloc(&y, (size_t)tokens * INTERMEDIATE * 2));
        swiglu_reference<<<tokens, 256>>>(scaled, y);
        for (const Case c : {Case{0, 0, 0, "per token"}, Case{128, 0, 0, "per group"}, Case{0, 3.0f, 0, "capped"},
                             Case{0, 0, 0.05f, "static"}}) {
            if (unscaled && c.group) continue;  // the unscaled product has one scale per token
            const int groups = c.group ? (INTERMEDIATE + c.group - 1) / c.group : 1;
            const size_t count = (size_t)tokens * INTERMEDIATE;
            uint8_t *q1, *q2; uint16_t *d1, *d2; float *s1, *s2;
            CHECK(cudaMalloc(&q1, count)); CHECK(cudaMalloc(&q2, count));
            CHECK(cudaMalloc(&d1, count * 2)); CHECK(cudaMalloc(&d2, count * 2));
            CHECK(cudaMalloc(&s1, tokens * groups * 4)); CHECK(cudaMalloc(&s2, tokens * groups * 4));
            fp8_quantize_input<<<dim3(tokens, groups), c.group ? c.group : FP8_QUANT_THREADS>>>(y, INTERMEDIATE, c.group, c.ub, c.fixed, q1, d1, s1);
            if (unscaled) CHECK(cudaMemcpy(s2, xs.data(), tokens * 4, cudaMemcpyHostToDevice));
            fp8_swiglu_quantize<<<dim3(tokens, groups), c.group ? c.group : FP8_QUANT_THREADS>>>(dgu, unscaled ? s2 : nullptr,
                                                                            unscaled ? dws : nullptr, c.group, c.ub,
                                                                            c.fixed, q2, d2, s2);
            const bool same = finish_and_download(q1, count) == finish_and_download(q2, count) &&
                              finish_and_download(d1, count) == finish_and_download(d2, count) &&
                              finish_and_download(s1, tokens * groups) == finish_and_download(s2, tokens * groups);
            printf("RESULT fp8_swiglu_quantize %s%s: %s\n", c.name, unscaled ? " (scaling the product itself)" : "",
                   same ? "same as SwiGLU then fp8_quantize_input" : "DIFFERS");
            failures += same ? 0 : 1;
            CHECK(cudaFree(q1)); CHECK(cudaFree(q2)); CHECK(cudaFree(d1)); CHECK(cudaFree(d2));
            CHECK(cudaFree(s1)); CHECK(cudaFree(s2));
        }
        CHECK(cudaFree(y)); CHECK(cudaFree(scaled)); CHECK(cudaFree((void*)dgu)); CHECK(cudaFree((void*)dws));
    }
    // The residual add and RMSNorm applying an unscaled product's scales itself
    // (fp8_add_rmsnorm with x_scales and w_scales) against fp8_scale_output first: the same
    // residual, output, codes, values and scales, bit for bit, dynamic and static.
    {
        const int rows = 5;
        std::vector<float> res((size_t)rows * HIDDEN), d((size_t)rows * HIDDEN), xs(rows), ws(HIDDEN);
        std::vector<uint16_t> nw(HIDDEN);
        for (auto& v : res) v = normal(rng);
        for (auto& v : d) v = normal(rng) * 300.0f;
        for (auto& v : xs) v = 0.001f + (rng() % 100) * 1e-4f;
        for (auto& v : ws) v = 0.0005f + (rng() % 100) * 1e-5f;
        for (auto& v : nw) v = to_bf16(0.5f + (rng() % 100) * 0.01f);
        const float* dws = upload(ws);
        const uint16_t* dnw = upload(nw);
        for (const float fixed : {0.0f, 0.05f}) {
            float* res_a = upload(res); float* res_b = upload(res);
            float* scaled = upload(d); const float* raw = upload(d);
            float* s_a; CHECK(cudaMalloc(&s_a, rows * 4));
            float* s_b = upload(xs);
            const float* dxs = upload(xs);
            uint16_t *o_a, *o_b, *x_a, *x_b; uint8_t *q_a, *q_b;
            const size_t count = (size_t)rows * HIDDEN;
            CHECK(cudaMalloc(&o_a, count * 2)); CHECK(cudaMalloc(&o_b, count * 2));
            CHECK(cudaMalloc(&x_a, count * 2)); CHECK(cudaMalloc(&x_b, count * 2));
            CHECK(cudaMalloc(&q_a, count)); CHECK(cudaMalloc(&q_b, count));
            fp8_scale_output<<<64, 256>>>(scaled, dxs, dws, rows, HIDDEN);
            fp8_add_rmsnorm<<<rows, RMS_THREADS>>>(res_a, scaled, nullptr, nullptr, dnw, o_a, 0.0f, fixed, q_a, x_a, s_a);
            fp8_add_rmsnorm<<<rows, RMS_THREADS>>>(res_b, raw, s_b, dws, dnw, o_b, 0.0f, fixed, q_b, x_b, s_b);
            const bool same = finish_and_download(res_a, count) == finish_and_download(res_b, count) &&
                              finish_and_download(o_a, count) == finish_and_download(o_b, count) &&
                              finish_and_download(q_a, count) == finish_and_download(q_b, count) &&
                              finish_and_download(x_a, count) == finish_and_download(x_b, count) &&
                              finish_and_download(s_a, rows) == finish_and_download(s_b, rows);
            printf("RESULT fp8_add_rmsnorm scaling the product itself (%s): %s\n", fixed > 0 ? "static" : "dynamic",
                   same ? "same as fp8_scale_output first" : "DIFFERS");
            failures += same ? 0 : 1;
            for (void* p : {(void*)res_a, (void*)res_b, (void*)scaled, (void*)raw, (void*)s_a, (void*)s_b, (void*)dxs,
                            (void*)o_a, (void*)o_b, (void*)x_a, (void*)x_b, (void*)q_a, (void*)q_b})
                CHECK(cudaFree(p));
        }
        CHECK(cudaFree((void*)dws)); CHECK(cudaFree((void*)dnw));
    }
    // Products and widening on ragged shapes (3 steps of 512 columns, the last partial), per-row
    // and per-group scales, every M and every launch geometry.
    for (const int group : {0, 128}) {
        const int n = 77, kk = 1200;  // 10 groups of 128, the last partial
        const int groups = group ? (kk + group - 1) / group : 1;
        std::vector<uint8_t> w(n * kk);
        for (auto& b : w) { b = (uint8_t)(rng() & 0xff); if ((b & 0x7f) == 0x7f) b = 0x38; }
        std::vector<float> s(n * groups);
        for (auto& v : s) v = 0.001f + (rng() % 1000) * 1e-5f;
        const uint8_t* dw = upload(w);
        const float* ds = upload(s);
        for (int m = 1; m <= 8; ++m) {
            std::vector<uint16_t> xm(m * kk);
            for (auto& v : xm) v = to_bf16(normal(rng));
            const uint16_t* dxm = upload(xm);
            std::vector<double> want(m * n), norm(m * n);
            for (int r = 0; r < m; ++r)
                for (int j = 0; j < n; ++j)
                    for (int i = 0; i < kk; ++i) {
                        const double p = from_bf16(xm[r * kk + i]) * host_value(w[j * kk + i]) * s[j * groups + (group ? i / group : 0)];
                        want[r * n + j] += p; norm[r * n + j] += std::fabs(p);
                    }
            float* out; CHECK(cudaMalloc(&out, m * n * 4));
            for (const Geometry& geo : geometries()) {
                CHECK(cudaMemset(out, 0xff, m * n * 4));
                gemv_any(geo, m, dxm, dw, ds, out, n, kk, groups, group ? group : kk);
                const auto got = finish_and_download(out, m * n);
                int bad = 0; double worst = 0;
                for (int i = 0; i < m * n; ++i) {
                    const double err = std::fabs(got[i] - want[i]);
                    worst = std::max(worst, err / (norm[i] + 1e-30));
                    if (!(err <= 1e-4 * norm[i] + 1e-6)) ++bad;
                }
                if (bad) printf("RESULT fp8_gemv m=%d rows=%d warps=%d splits=%d groups %d: %d mismatches (worst %.2e of the absolute sum)\n", m, geo.rows, geo.warps, geo.splits, groups, bad, worst);
                failures += bad;
            }
            CHECK(cudaFree(out)); CHECK(cudaFree((void*)dxm));
        }
        uint16_t* wide; CHECK(cudaMalloc(&wide, n * kk * 2));
        fp8_dequantize_weight<<<64, 256>>>(dw, ds, n, kk, groups, group ? group : kk, wide);
        const auto widened = finish_and_download(wide, n * kk);
        int bad = 0;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < kk; ++i)
                if (widened[j * kk + i] != to_bf16((float)host_value(w[j * kk + i]) * s[j * groups + (group ? i / group : 0)])) ++bad;
        printf("RESULT fp8_gemv m1..8 (every geometry) and fp8_dequantize_weight, %d group(s) per row: %s (widening %d mismatches)\n", groups,
               failures ? "FAILED" : "ok", bad);
        failures += bad;
        CHECK(cudaFree(wide)); CHECK(cudaFree((void*)dw)); CHECK(cudaFree((void*)ds));
    }
    printf("RESULT fp8 tests: %s\n", failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}

// Llama-3.1-8B's decode products at M = 1, 2, 4, 8 in every launch geometry (FP8_BENCH_REPS
// launches each, weights cycled through 8 copies so no launch reads them from L2): the read rate
// as a share of the copy bandwidth, one line per geometry, then the best per shape and M.
static int bench() {
    const double copy = copy_bandwidth();
    struct Shape { const char* name; int n, k; };
    const Shape shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
    const int copies = 8;
    const int reps = getenv("FP8_BENCH_REPS") ? atoi(getenv("FP8_BENCH_REPS")) : 40;
    for (const Shape& sh : shapes) {
        const size_t bytes = (size_t)sh.n * sh.k;
        std::vector<uint8_t*> w(copies);
        for (auto& p : w) { CHECK(cudaMalloc(&p, bytes)); CHECK(cudaMemset(p, 0x34, bytes)); }
        float* s; CHECK(cudaMalloc(&s, sh.n * 4)); CHECK(cudaMemset(s, 0, sh.n * 4));
        uint16_t* x; CHECK(cudaMalloc(&x, 8 * sh.k * 2)); CHECK(cudaMemset(x, 0, 8 * sh.k * 2));
        float* out; CHECK(cudaMalloc(&out, 8 * sh.n * 4));
        for (const int m : {1, 2, 4, 8}) {
            double best = 1e9; Geometry best_geo{};
            for (const Geometry& geo : geometries()) {
                for (int i = 0; i < copies; ++i) gemv_any(geo, m, x, w[i], s, out, sh.n, sh.k, 1, sh.k);
                StreamTimer timer;
                for (int i = 0; i < reps; ++i) gemv_any(geo, m, x, w[i % copies], s, out, sh.n, sh.k, 1, sh.k);
                const double secs = timer.seconds() / reps;
                if (secs < best) { best = secs; best_geo = geo; }
                printf("fp8_gemv %s n=%d k=%d m=%d rows=%d warps=%d splits=%d: %.2f us, %.0f%% of copy bandwidth\n", sh.name,
                       sh.n, sh.k, m, geo.rows, geo.warps, geo.splits, secs * 1e6, 100.0 * bytes / secs / copy);
            }
            printf("RESULT fp8_gemv %s n=%d k=%d m=%d best rows=%d warps=%d splits=%d: %.2f us, %.0f GB/s weights, %.0f%% of copy bandwidth\n",
                   sh.name, sh.n, sh.k, m, best_geo.rows, best_geo.warps, best_geo.splits, best * 1e6, bytes / best / 1e9,
                   100.0 * bytes / best / copy);
        }
        for (auto p : w) CHECK(cudaFree(p));
        CHECK(cudaFree(s)); CHECK(cudaFree(x)); CHECK(cudaFree(out));
    }
    // The down product's input at decode: fp8_swiglu_quantize against SwiGLU then
    // fp8_quantize_input (the launches it replaces; swiglu_reference stands in for
    // kernels/swiglu.cu), per token.
    for (const int tokens : {1, 8}) {
        float* gu; CHECK(cudaMalloc(&gu, (size_t)tokens * 2 * INTERMEDIATE * 4));
        CHECK(cudaMemset(gu, 0, (size_t)tokens * 2 * INTERMEDIATE * 4));
        uint16_t *y, *d; uint8_t* q; float* sc;
        CHECK(cudaMalloc(&y, (size_t)tokens * INTERMEDIATE * 2)); CHECK(cudaMalloc(&d, (size_t)tokens * INTERMEDIATE * 2));
        CHECK(cudaMalloc(&q, (size_t)tokens * INTERMEDIATE)); CHECK(cudaMalloc(&sc, tokens * 4));
        double fused = 0, separate = 0;
        for (int pass = 0; pass < 2; ++pass) {
            StreamTimer timer;
            for (int i = 0; i < reps; ++i)
                fp8_swiglu_quantize<<<tokens, FP8_QUANT_THREADS>>>(gu, nullptr, nullptr, 0, 0.0f, 0.0f, q, d, sc);
            fused = timer.seconds() / reps;
            StreamTimer timer2;
            for (int i = 0; i < reps; ++i) {
                swiglu_reference<<<tokens, 256>>>(gu, y);
                fp8_quantize_input<<<tokens, FP8_QUANT_THREADS>>>(y, INTERMEDIATE, 0, 0.0f, 0.0f, q, d, sc);
            }
            separate = timer2.seconds() / reps;
        }
        printf("RESULT fp8_swiglu_quantize tokens=%d: %.2f us, SwiGLU then fp8_quantize_input %.2f us\n", tokens,
               fused * 1e6, separate * 1e6);
        CHECK(cudaFree(gu)); CHECK(cudaFree(y)); CHECK(cudaFree(d)); CHECK(cudaFree(q)); CHECK(cudaFree(sc));
    }
    return 0;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "test";
    if (!strcmp(mode, "bench")) return bench();
    return test();
}
