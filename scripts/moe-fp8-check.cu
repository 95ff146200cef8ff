// FP8 experts (kernels/moe_fp8.cu, with kernels/moe.cu's routing, permutation and tiles) against
// host references, built with nvcc on the GPU machine by scripts/gpu-check.sh (stage "moefp8", once
// per expert shape: HIDDEN and the MOE_* defines, GEMV_* as the backend passes them).
//   moe-fp8-check test   for several token counts (the fused one-block routing for up to 8, the
//                        separate kernels above; the small-M FP8 loops, and the tensor-core tiles
//                        from 16 rows per expert on average) and each scheme of the experts' FP8
//                        (per-row weight scales with inputs rounded per token; per-block weight
//                        scales with inputs rounded per token and group; one weight scale per
//                        expert with each expert's static input scale; weight-only): the rounding
//                        of the gathered rows and of the SwiGLU rows byte for byte against the
//                        host's (the same float arithmetic), the gate/up product with SwiGLU and
//                        the down product against float64 references over the dequantized weights
//                        and the device's rounded inputs, and the combine. Exits 1 on a mismatch.
//   moe-fp8-check quick  the same with at most 160 tokens (for compute-sanitizer)
//   moe-fp8-check bench  steps of 1, 8, 64 and 256 tokens of the routed part of a layer (route,
//                        permute, gather, the two roundings, the grouped FP8 products, combine)
//                        in a CUDA graph, layers' weights cycled so every read comes from memory:
//                        time per layer and the active experts' FP8 bytes per second against the
//                        copy bandwidth.
// NOT YET RUN ON A GPU (written without one).
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
// The moe.cu family as the backend compiles it: gemv.cu's and fp8.cu's device code without their
// entry points, then moe.cu and moe_fp8.cu.
#define GEMV_NO_ENTRIES 1
#include "gemv.cu"
#define FP8_NO_ENTRIES 1
#include "fp8.cu"
#include "moe.cu"
#include "moe_fp8.cu"
#include "moe-check-common.cuh"

// One scheme of the experts' FP8: weight scales per row (`block` 0), per row and block of `block`
// columns, or one per expert (`per_expert`); inputs rounded dynamically (`input_group` 0: per
// row; else per row and group), by each expert's static scale (`static_input`), or not at all.
struct Scheme {
    const char* name;
    int block;
    bool per_expert;
    bool rounds;
    int input_group;
    bool static_input;
};

static const Scheme SCHEMES[] = {
    {"per-row scales, inputs per token", 0, false, true, 0, false},
    {"32-column block scales, inputs per token and 32-column group", 32, false, true, 32, false},
    {"one scale per expert, static input scales", 0, true, true, 0, true},
    {"per-row scales, weight-only", 0, false, false, 0, false},
};

// One projection of every expert in the device layout: [E, n, k] codes, [E, n, groups] scales.
struct Experts {
    int n, k, groups, group;
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    uint8_t* d_codes;
    float* d_scales;
    // The dequantized weight (row, col) of expert e, as the CPU reference holds it.
    double weight(int e, int row, int col) const {
        static const std::vector<float> values = [] {
            std::vector<float> v(256);
            for (int c = 0; c < 256; ++c) v[c] = host_e4m3_value((uint8_t)c);
            return v;
        }();
        const size_t r = (size_t)e * n + row;
        return (double)values[codes[r * k + col]] * scales[r * groups + (groups > 1 ? col / group : 0)];
    }
};

// Random weights (normal, std 0.05) quantized as `s` says: each scale the largest magnitude it
// covers over 448.
static Experts make_experts(int n, int k, const Scheme& s, std::mt19937& rng) {
    Experts x;
    x.n = n;
    x.k = k;
    x.groups = s.block ? (k + s.block - 1) / s.block : 1;
    x.group = s.block ? s.block : k;
    x.codes.resize((size_t)E * n * k);
    x.scales.resize((size_t)E * n * x.groups);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> w((size_t)n * k);
    for (int e = 0; e < E; ++e) {
        for (auto& v : w) v = normal(rng);
        float expert_max = 0;
        for (float v : w) expert_max = std::max(expert_max, std::fabs(v));
        for (int r = 0; r < n; ++r) {
            for (int g = 0; g < x.groups; ++g) {
                float amax = 0;
                for (int c = g * x.group; c < std::min(k, (g + 1) * x.group); ++c) amax = std::max(amax, std::fabs(w[(size_t)r * k + c]));
                if (s.per_expert) amax = expert_max;
                x.scales[((size_t)e * n + r) * x.groups + g] = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
            }
            for (int c = 0; c < k; ++c) {
                const float scale = x.scales[((size_t)e * n + r) * x.groups + c / x.group];
                x.codes[((size_t)e * n + r) * k + c] = host_e4m3(w[(size_t)r * k + c] / scale);
            }
        }
    }
    x.d_codes = upload(x.codes);
    x.d_scales = upload(x.scales);
    return x;
}

// Each expert's static input scales: the gathered rows are uniform in [-1, 1); the SwiGLU rows
// of wide experts may saturate at 448 times the scale, which the rounding must reproduce.
static std::vector<float> static_scales(float base) {
    std::vector<float> s(E);
    for (int e = 0; e < E; ++e) s[e] = base * (1.0f + 0.125f * (e % 5));
    return s;
}

// Routing, permutation and gather as the backend runs them for FP8 experts (one token: the fused
// entry gathers nothing, so the gather runs after it).
static void route_and_gather(const Buffers& b, int t, bool fused, cudaStream_t stream = 0) {
    route(b, t, fused, stream);
    if (fused && t == 1) moe_gather<<<K, 256, 0, stream>>>(b.x, b.sorted_tokens, b.x_perm, 1);
}

// The launch of the small-M FP8 products (src/backend/cuda/fp8.rs, GemvGeometry::choose(1, ..)):
// rows of 4, 4 warps, K split 2 ways where it has at least two 512-column steps.
static int splits_for(int k) { return std::min(2, (k + 511) / 512); }

static void round_rows(const Scheme& s, bf16* rows, int width, const float* statics, const Buffers& b, int t,
                       cudaStream_t stream) {
    if (!s.rounds) return;
    const int groups = s.input_group ? (width + s.input_group - 1) / s.input_group : 1;
    moe_fp8_round<<<dim3(t * K, groups), MOE_FP8_ROUND_THREADS, 0, stream>>>(
        rows, width, s.input_group, 0.0f, s.static_input ? statics : nullptr, b.meta);
}

static void gate_up_product(const Experts& gu, const Buffers& b, int t, cudaStream_t stream) {
    if (takes_gemm(t)) {
        const int tiles = (t * K + MOE_BM - 1) / MOE_BM + std::min(E, t * K);
        moe_fp8_gemm_gate_up<<<dim3((I + MOE_BN / 2 - 1) / (MOE_BN / 2), tiles), 128, 0, stream>>>(
            b.x_perm, gu.d_codes, gu.d_scales, b.meta, b.h_perm, gu.groups, gu.group);
    } else {
        const int splits = splits_for(H), per_block = 4 / splits;
        moe_fp8_gate_up<<<dim3((I / 2 + per_block - 1) / per_block, std::min(E, t * K)), 128, 0, stream>>>(
            b.x_perm, gu.d_codes, gu.d_scales, b.meta, b.h_perm, gu.groups, gu.group, splits);
    }
}

static void down_product(const Experts& dn, const Buffers& b, int t, cudaStream_t stream) {
    if (takes_gemm(t)) {
        const int tiles = (t * K + MOE_BM - 1) / MOE_BM + std::min(E, t * K);
        moe_fp8_gemm_down<<<dim3((H + MOE_BN - 1) / MOE_BN, tiles), 128, 0, stream>>>(
            b.h_perm, dn.d_codes, dn.d_scales, b.meta, b.y_perm, dn.groups, dn.group);
    } else {
        const int splits = splits_for(I), per_block = 4 * 4 / splits;
        moe_fp8_down<<<dim3((H + per_block - 1) / per_block, std::min(E, t * K)), 128, 0, stream>>>(
            b.h_perm, dn.d_codes, dn.d_scales, b.meta, b.y_perm, dn.groups, dn.group, splits);
    }
}

// The host's rounding of `rows` (bf16, `width` wide) as moe_fp8_round does it; row r's expert
// is expert_of[r].
static std::vector<uint16_t> host_round(const Scheme& s, const std::vector<uint16_t>& rows, int width,
                                        const std::vector<int>& expert_of, const std::vector<float>& statics) {
    if (!s.rounds) return rows;
    std::vector<uint16_t> out(rows.size());
    const int span = s.input_group ? s.input_group : width;
    for (size_t r = 0; r < rows.size() / width; ++r) {
        for (int first = 0; first < width; first += span) {
            const int last = std::min(width, first + span);
            float scale;
            if (s.static_input) {
                scale = statics[expert_of[r]];
            } else {
                float amax = 0;
                for (int i = first; i < last; ++i) amax = std::max(amax, std::fabs(from_bf16(rows[r * width + i])));
                scale = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
            }
            for (int i = first; i < last; ++i) {
                const uint8_t code = host_e4m3(from_bf16(rows[r * width + i]) / scale);
                out[r * width + i] = to_bf16(host_e4m3_value(code) * scale);
            }
        }
    }
    return out;
}

static int test(int t, bool fused, const Scheme& s, std::mt19937& rng, const Buffers& b, const Experts& gu,
                const Experts& dn, const std::vector<float>& statics_gu, const std::vector<float>& statics_dn) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> logits((size_t)t * MOE_LOGITS);
    for (auto& v : logits) v = normal(rng);
    std::vector<int> tokens(t);
    for (int i = 0; i < t; ++i) tokens[i] = i;
    std::vector<uint16_t> x((size_t)t * H);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (auto& v : x) v = to_bf16(uniform(rng));
    CHECK(cudaMemcpy(b.logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.tokens, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    const size_t rows = (size_t)t * K;
    route_and_gather(b, t, fused);
    auto gathered = finish_and_download(b.x_perm, rows * H);
    round_rows(s, b.x_perm, H, b.static_gate_up, b, t, 0);
    auto x_rounded = finish_and_download(b.x_perm, rows * H);
    gate_up_product(gu, b, t, 0);
    auto h = finish_and_download(b.h_perm, rows * I);
    round_rows(s, b.h_perm, I, b.static_down, b, t, 0);
    auto h_rounded = finish_and_download(b.h_perm, rows * I);
    down_product(dn, b, t, 0);
    moe_combine<<<t, 256>>>(b.y_perm, b.row_of, b.weights, b.logits, nullptr, b.delta);
    auto y = finish_and_download(b.y_perm, rows * H);
    auto delta = finish_and_download(b.delta, (size_t)t * H);
    auto ids = finish_and_download(b.ids, rows);
    auto weights = finish_and_download(b.weights, rows);
    auto row_of = finish_and_download(b.row_of, rows);
    int bad = 0;
    const auto fail = [&](const char* what, long at, double got, double want) {
        if (bad++ < 10) fprintf(stderr, "t=%d %s: %s at %ld: got %g, want %g\n", t, s.name, what, at, got, want);
    };
    std::vector<int> expert_of(rows);
    for (size_t i = 0; i < rows; ++i) expert_of[row_of[i]] = ids[i];
    // The roundings, byte for byte.
    const auto want_x = host_round(s, gathered, H, expert_of, statics_gu);
    for (size_t i = 0; i < want_x.size(); ++i)
        if (want_x[i] != x_rounded[i]) fail("rounded input", i, from_bf16(x_rounded[i]), from_bf16(want_x[i]));
    const auto want_h = host_round(s, h, I, expert_of, statics_dn);
    for (size_t i = 0; i < want_h.size(); ++i)
        if (want_h[i] != h_rounded[i]) fail("rounded SwiGLU row", i, from_bf16(h_rounded[i]), from_bf16(want_h[i]));
    // The products on a sample of rows (24 at the tiny shape, fewer for wider experts: the float64
    // reference is slow on the host):
    // gate/up from the device's rounded rows, down from its rounded SwiGLU rows. The tiles widen
    // the weights to bf16 (a relative 2^-9 each), hence the bounds' share of the sum of magnitudes.
    double worst_h = 0, worst_y = 0, worst_d = 0;
    const size_t sample = std::max<size_t>(1, 24 * 64 * 64 / ((size_t)H * I));
    const size_t stride = std::max<size_t>(1, rows / sample);
    for (size_t r = 0; r < rows && bad == 0; r += stride) {
        const int e = expert_of[r];
        for (int j = 0; j < I; ++j) {
            const int gate_row = 4 * (j / 2) + j % 2;
            double g = 0, u = 0, size = 0;
            for (int k = 0; k < H; ++k) {
                const double xv = from_bf16(x_rounded[r * H + k]);
                const double wg = gu.weight(e, gate_row, k), wu = gu.weight(e, gate_row + 2, k);
                g += xv * wg;
                u += xv * wu;
                size += std::fabs(xv * wg) + std::fabs(xv * wu);
            }
            const double want = silu(g) * u, got = from_bf16(h[r * I + j]);
            const double err = std::fabs(got - want);
            worst_h = std::max(worst_h, err);
            if (!(err <= 1e-3 + 1e-2 * std::fabs(want) + 4e-3 * size * (std::fabs(u) + std::fabs(g)))) fail("gate/up + SwiGLU", r, got, want);
        }
        for (int n = 0; n < H; ++n) {
            double want = 0, size = 0;
            for (int k = 0; k < I; ++k) {
                const double term = from_bf16(h_rounded[r * I + k]) * dn.weight(e, n, k);
                want += term;
                size += std::fabs(term);
            }
            const double err = std::fabs(y[r * H + n] - want);
            worst_y = std::max(worst_y, err);
            if (!(err <= 1e-5 + 1e-3 * std::fabs(want) + 4e-3 * size)) fail("down", r, y[r * H + n], want);
        }
    }
    for (int tok = 0; tok < t && bad == 0; ++tok) {
        for (int n = 0; n < H; ++n) {
            double want = 0;
            for (int k = 0; k < K; ++k) want += (double)weights[tok * K + k] * y[(size_t)row_of[tok * K + k] * H + n];
            const double err = std::fabs(delta[(size_t)tok * H + n] - want);
            worst_d = std::max(worst_d, err);
            if (!(err <= 1e-5 + 1e-5 * std::fabs(want))) fail("combine", tok, delta[(size_t)tok * H + n], want);
        }
    }
    printf("RESULT moe fp8 test E=%d K=%d H=%d I=%d t=%d %s, %s products, %s: max err h %.2e y %.2e delta %.2e: %s\n", E,
           K, H, I, t, fused ? "fused" : "separate", takes_gemm(t) ? "tensor-core tile" : "small-M", s.name, worst_h,
           worst_y, worst_d, bad ? "FAIL" : "ok");
    return bad;
}

static int run_tests(bool quick) {
    std::mt19937 rng(45);
    const int max_tokens = quick ? 160 : 300;
    Buffers b = allocate(max_tokens, false);
    const auto statics_gu = static_scales(1.0f / 256.0f), statics_dn = static_scales(1.0f / 4096.0f);
    b.static_gate_up = upload(statics_gu);
    b.static_down = upload(statics_dn);
    int bad = 0;
    for (const Scheme& s : SCHEMES) {
        const Experts gu = make_experts(2 * I, H, s, rng), dn = make_experts(H, I, s, rng);
        for (int t : {1, 3, 8}) bad += test(t, true, s, rng, b, gu, dn, statics_gu, statics_dn);
        for (int t : {9, 37, max_tokens}) bad += test(t, false, s, rng, b, gu, dn, statics_gu, statics_dn);
        CHECK(cudaFree(gu.d_codes));
        CHECK(cudaFree(gu.d_scales));
        CHECK(cudaFree(dn.d_codes));
        CHECK(cudaFree(dn.d_scales));
    }
    return bad ? 1 : 0;
}

static int run_bench() {
    const double copy = copy_bandwidth();
    const int layers = 4;
    const Scheme& s = SCHEMES[0];
    const size_t gate_up_bytes = (size_t)E * 2 * I * H, down_bytes = (size_t)E * H * I;
    std::vector<Experts> gu(layers), dn(layers);
    for (int l = 0; l < layers; ++l) {
        for (auto* x : {&gu[l], &dn[l]}) {
            const bool is_gu = x == &gu[l];
            x->n = is_gu ? 2 * I : H;
            x->k = is_gu ? H : I;
            x->groups = 1;
            x->group = x->k;
            const size_t bytes = is_gu ? gate_up_bytes : down_bytes;
            CHECK(cudaMalloc(&x->d_codes, bytes));
            fill_e4m3<<<4096, 256>>>(x->d_codes, bytes, 17 + 2 * l + is_gu);
            std::vector<float> scales((size_t)E * x->n, 1.0f / 1024.0f);
            x->d_scales = upload(scales);
        }
    }
    const int max_tokens = 256;
    Buffers b = allocate(max_tokens, false);
    bench_inputs(b, max_tokens);
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    for (int t : {1, 8, 64, 256}) {
        const auto record = [&](int l) {
            route_and_gather(b, t, t <= 8, stream);
            round_rows(s, b.x_perm, H, nullptr, b, t, stream);
            gate_up_product(gu[l], b, t, stream);
            round_rows(s, b.h_perm, I, nullptr, b, t, stream);
            down_product(dn[l], b, t, stream);
            moe_combine<<<t, 256, 0, stream>>>(b.y_perm, b.row_of, b.weights, b.logits, nullptr, b.delta);
        };
        const double seconds = graph_seconds_per_layer(stream, layers, record);
        auto meta = finish_and_download(b.meta, MOE_META_WORDS);
        const int active = meta[MOE_META_COUNT];
        const double bytes = (double)active * 3 * I * H;
        printf("RESULT moe fp8 bench E=%d K=%d H=%d I=%d tokens=%d (%s products): %d active experts, %.1f us per layer, "
               "%.0f GB/s of active FP8 expert weights = %.0f%% of copy bandwidth\n",
               E, K, H, I, t, takes_gemm(t) ? "tensor-core tile" : "small-M", active, seconds * 1e6, bytes / seconds / 1e9,
               100.0 * bytes / seconds / (copy / 2));
    }
    return 0;
}

int main(int argc, char** argv) { return moe_check_main(argc, argv, "moe-fp8-check", run_tests, run_bench); }
