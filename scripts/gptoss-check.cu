// gpt-oss's expert kernels (kernels/gpt_oss.cu) against float64 host references on random data,
// built with nvcc on the GPU machine by scripts/gpu-check.sh (stage "gptoss") with the model's
// shapes as -D defines (HIDDEN, MOE_EXPERTS, MOE_TOP_K, MOE_INTER, GPTOSS_ALPHA, GPTOSS_LIMIT), as
// NVRTC gets them from the backend.
//
//   gptoss-check test [SEED]   for 1, 3 and 40 tokens: the routing (biased logits, top k, softmax
//                              over the k) against the host's; the gate/up product through the
//                              clamped SwiGLU and the down product, each over MXFP4 experts (random
//                              E2M1 codes and E8M0 scales, every code and sign drawn) and over the
//                              same experts widened to bf16, against float64 references over the
//                              same values; the combine in expert order; the output bias; the
//                              grouped path (prefill: gptoss_permute, gptoss_gather, the tile
//                              products over MXFP4 and bf16 experts, the combine through the
//                              permutation) against the same references. Exits 1 on a mismatch.
//                              SEED defaults to a fresh random one (printed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "check-common.cuh"

#undef INFINITY
#include "prelude.cuh"
// The family as the backend compiles it: gemv.cu's, fp8.cu's and moe.cu's device code (the
// permutation and the tensor-core tile) without their entry points, then gpt_oss.cu.
#define GEMV_NO_ENTRIES 1
#include "gemv.cu"
#define FP8_NO_ENTRIES 1
#include "fp8.cu"
#define MOE_NO_ENTRIES 1
#include "moe.cu"
#include "gpt_oss.cu"

static const int E = MOE_EXPERTS, K = MOE_TOP_K, I = MOE_INTER;

// The host's E2M1 and E8M0 values (src/model/mxfp4.rs).
static double e2m1(int code) {
    static const double values[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    return (code & 8 ? -1.0 : 1.0) * values[code & 7];
}
static double e8m0_value(int byte) { return std::ldexp(1.0, byte - 127); }

// One expert projection [E, rows, cols] in MXFP4 (blocks, scales) and its values widened.
struct Experts {
    std::vector<uint8_t> blocks, scales;
    std::vector<double> values;      // exact
    std::vector<uint16_t> bf16;      // the same values in bf16 (exact: 3 significant bits)
    int rows, cols;
    Experts(std::mt19937_64& rng, int rows_, int cols_) : rows(rows_), cols(cols_) {
        const size_t n = (size_t)E * rows * cols;
        blocks.resize(n / 2);
        scales.resize(n / 32);
        std::uniform_int_distribution<int> byte(0, 255), scale(118, 124);
        for (auto& b : blocks) b = (uint8_t)byte(rng);
        for (auto& s : scales) s = (uint8_t)scale(rng);
        values.resize(n);
        bf16.resize(n);
        for (size_t i = 0; i < n; ++i) {
            const int code = i % 2 ? blocks[i / 2] >> 4 : blocks[i / 2] & 15;
            values[i] = e2m1(code) * e8m0_value(scales[i / 32]);
            bf16[i] = to_bf16((float)values[i]);
        }
    }
};

static std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t n, float gain) {
    std::uniform_real_distribution<float> uni(-gain, gain);
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = to_bf16(uni(rng));
    return v;
}

template <typename T>
static T* device_copy(const std::vector<T>& v) {
    return upload(v);
}

static int check_tokens(std::mt19937_64& rng, int tokens) {
    int failures = 0;
    const int slots = tokens * K;
    // Routing: logits and bias whose biased values are distinct (no tie at the boundary).
    std::vector<float> logits((size_t)tokens * E);
    std::vector<uint16_t> router_bias = random_bf16(rng, E, 1.0f);
    std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
    for (auto& l : logits) l = uni(rng);
    std::vector<int> want_ids((size_t)slots);
    std::vector<double> want_w((size_t)slots);
    for (int t = 0; t < tokens; ++t) {
        std::vector<std::pair<float, int>> biased(E);
        for (int e = 0; e < E; ++e) biased[e] = {logits[(size_t)t * E + e] + from_bf16(router_bias[e]), e};
        std::partial_sort(biased.begin(), biased.begin() + K, biased.end(),
                          [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
        double total = 0.0;
        for (int k = 0; k < K; ++k) total += std::exp((double)biased[k].first - biased[0].first);
        for (int k = 0; k < K; ++k) {
            want_ids[(size_t)t * K + k] = biased[k].second;
            want_w[(size_t)t * K + k] = std::exp((double)biased[k].first - biased[0].first) / total;
        }
    }
    float* dlogits = device_copy(logits);
    uint16_t* dbias = device_copy(router_bias);
    int* dids;
    float* dweights;
    CHECK(cudaMalloc(&dids, slots * 4));
    CHECK(cudaMalloc(&dweights, slots * 4));
    gptoss_route<<<(tokens + GO_WARPS - 1) / GO_WARPS, GO_WARPS * 32>>>(dlogits, dbias, dids, dweights, tokens);
    const std::vector<int> ids = finish_and_download(dids, slots);
    const std::vector<float> weights = finish_and_download(dweights, slots);
    int route_bad = 0;
    for (int s = 0; s < slots; ++s) {
        if (ids[s] != want_ids[s] || std::fabs(weights[s] - want_w[s]) > 1e-6) ++route_bad;
    }
    printf("RESULT gptoss route tokens=%d: %s (%d slots differ)\n", tokens, route_bad ? "FAIL" : "ok", route_bad);
    failures += route_bad;

    // Gate/up through the clamped SwiGLU, then down, over MXFP4 and bf16 experts.
    Experts gate_up(rng, 2 * I, HIDDEN), down(rng, HIDDEN, I);
    std::vector<uint16_t> gate_up_bias = random_bf16(rng, (size_t)E * 2 * I, 0.5f);
    std::vector<uint16_t> down_bias = random_bf16(rng, (size_t)E * HIDDEN, 0.5f);
    std::vector<uint16_t> x = random_bf16(rng, (size_t)tokens * HIDDEN, 1.0f);
    std::vector<double> want_act((size_t)slots * I);
    for (int s = 0; s < slots; ++s) {
        const int e = want_ids[s], t = s / K;
        for (int i = 0; i < I; ++i) {
            double g = 0.0, u = 0.0;
            for (int h = 0; h < HIDDEN; ++h) {
                const double xv = from_bf16(x[(size_t)t * HIDDEN + h]);
                g += xv * gate_up.values[((size_t)e * 2 * I + 2 * i) * HIDDEN + h];
                u += xv * gate_up.values[((size_t)e * 2 * I + 2 * i + 1) * HIDDEN + h];
            }
            g = std::min(g + from_bf16(gate_up_bias[(size_t)e * 2 * I + 2 * i]), (double)GPTOSS_LIMIT);
            u = std::clamp(u + from_bf16(gate_up_bias[(size_t)e * 2 * I + 2 * i + 1]), -(double)GPTOSS_LIMIT,
                           (double)GPTOSS_LIMIT);
            want_act[(size_t)s * I + i] = (u + 1.0) * g / (1.0 + std::exp(-g * (double)GPTOSS_ALPHA));
        }
    }
    uint16_t* dx = device_copy(x);
    uint16_t* dgu_bias = device_copy(gate_up_bias);
    uint16_t* dd_bias = device_copy(down_bias);
    uint8_t* dgu_blocks = device_copy(gate_up.blocks);
    uint8_t* dgu_scales = device_copy(gate_up.scales);
    uint16_t* dgu_bf16 = device_copy(gate_up.bf16);
    uint8_t* dd_blocks = device_copy(down.blocks);
    uint8_t* dd_scales = device_copy(down.scales);
    uint16_t* dd_bf16 = device_copy(down.bf16);
    uint16_t* dact;
    float* dy;
    CHECK(cudaMalloc(&dact, (size_t)slots * I * 2));
    CHECK(cudaMalloc(&dy, (size_t)slots * HIDDEN * 4));
    for (int mx = 0; mx < 2; ++mx) {
        const char* kind = mx ? "mxfp4" : "bf16";
        CHECK(cudaMemset(dact, 0xff, (size_t)slots * I * 2));
        const dim3 gu_grid(slots, (I + GO_WARPS - 1) / GO_WARPS);
        if (mx) {
            gptoss_gate_up_mxfp4<<<gu_grid, GO_WARPS * 32>>>(dx, dgu_blocks, dgu_scales, dgu_bias, dids, dact);
        } else {
            gptoss_gate_up<<<gu_grid, GO_WARPS * 32>>>(dx, dgu_bf16, dgu_bias, dids, dact);
        }
        const std::vector<uint16_t> act = finish_and_download(dact, (size_t)slots * I);
        double worst = 0.0;
        // One bf16 rounding of each output, and float accumulation over HIDDEN terms.
        const int bad_act = count_mismatches(act, want_act, 2e-3, 8e-3, 5, worst, [&](size_t i, double got, double want) {
            fprintf(stderr, "MISMATCH %s gate_up slot=%zu i=%zu: got %g want %g\n", kind, i / I, i % I, got, want);
        });
        printf("RESULT gptoss gate_up %s tokens=%d: %s (%d mismatches, max abs error %.2e)\n", kind, tokens,
               bad_act ? "FAIL" : "ok", bad_act, worst);
        failures += bad_act;

        // Down over the kernel's own activations (so this product is checked alone).
        std::vector<double> want_y((size_t)slots * HIDDEN);
        for (int s = 0; s < slots; ++s) {
            const int e = want_ids[s];
            for (int h = 0; h < HIDDEN; ++h) {
                double sum = from_bf16(down_bias[(size_t)e * HIDDEN + h]);
                for (int i = 0; i < I; ++i)
                    sum += (double)from_bf16(act[(size_t)s * I + i]) * down.values[((size_t)e * HIDDEN + h) * I + i];
                want_y[(size_t)s * HIDDEN + h] = sum;
            }
        }
        const dim3 d_grid(slots, (HIDDEN + GO_WARPS - 1) / GO_WARPS);
        if (mx) {
            gptoss_down_mxfp4<<<d_grid, GO_WARPS * 32>>>(dact, dd_blocks, dd_scales, dd_bias, dids, dy);
        } else {
            gptoss_down<<<d_grid, GO_WARPS * 32>>>(dact, dd_bf16, dd_bias, dids, dy);
        }
        const std::vector<float> y = finish_and_download(dy, (size_t)slots * HIDDEN);
        int bad_y = 0;
        double worst_y = 0.0;
        for (size_t i = 0; i < y.size(); ++i) {
            const double err = std::fabs(y[i] - want_y[i]);
            if (!(err <= 1e-3 + 1e-4 * std::fabs(want_y[i]))) ++bad_y;
            if (err == err) worst_y = std::max(worst_y, err);
        }
        printf("RESULT gptoss down %s tokens=%d: %s (%d mismatches, max abs error %.2e)\n", kind, tokens,
               bad_y ? "FAIL" : "ok", bad_y, worst_y);
        failures += bad_y;

        // The combine in expert order, then the output bias, over the kernel's own y.
        if (mx) {
            std::vector<double> want_delta((size_t)tokens * HIDDEN);
            std::vector<uint16_t> o_bias = random_bf16(rng, HIDDEN, 0.5f);
            for (int t = 0; t < tokens; ++t) {
                std::vector<int> order(K);
                std::iota(order.begin(), order.end(), 0);
                std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[t * K + a] < ids[t * K + b]; });
                for (int h = 0; h < HIDDEN; ++h) {
                    double sum = 0.0;
                    for (int k : order) sum += (double)y[((size_t)t * K + k) * HIDDEN + h] * weights[t * K + k];
                    want_delta[(size_t)t * HIDDEN + h] = sum + from_bf16(o_bias[h]);
                }
            }
            float* ddelta;
            CHECK(cudaMalloc(&ddelta, (size_t)tokens * HIDDEN * 4));
            uint16_t* do_bias = device_copy(o_bias);
            gptoss_combine<<<tokens, 256>>>(dy, nullptr, dids, dweights, ddelta);
            gptoss_add_bias<<<tokens, 256>>>(ddelta, do_bias);
            const std::vector<float> delta = finish_and_download(ddelta, (size_t)tokens * HIDDEN);
            int bad_delta = 0;
            for (size_t i = 0; i < delta.size(); ++i) {
                if (!(std::fabs(delta[i] - want_delta[i]) <= 1e-3 + 1e-4 * std::fabs(want_delta[i]))) ++bad_delta;
            }
            printf("RESULT gptoss combine+bias tokens=%d: %s (%d mismatches)\n", tokens, bad_delta ? "FAIL" : "ok",
                   bad_delta);
            failures += bad_delta;
            CHECK(cudaFree(ddelta));
            CHECK(cudaFree(do_bias));
        }
    }
    // The grouped path (kernels/moe.cu's permutation and tiles, as the backend runs it for many
    // rows per expert; checked here at every size): each permuted row's activations against its
    // slot's reference, its down product against float64 over the kernel's own activations, and the
    // combine through the permutation against the weighted sum in expert order.
    {
        int *dmeta, *dsorted, *drow_of;
        uint16_t* dx_perm;
        float* ddelta;
        CHECK(cudaMalloc(&dmeta, MOE_META_WORDS * 4));
        CHECK(cudaMalloc(&dsorted, slots * 4));
        CHECK(cudaMalloc(&drow_of, slots * 4));
        CHECK(cudaMalloc(&dx_perm, (size_t)slots * HIDDEN * 2));
        CHECK(cudaMalloc(&ddelta, (size_t)tokens * HIDDEN * 4));
        gptoss_permute<<<1, 1024>>>(dids, dmeta, dsorted, drow_of, tokens);
        gptoss_gather<<<std::min(slots, 4096), 256>>>(dx, dsorted, dx_perm, tokens);
        const std::vector<int> row_of = finish_and_download(drow_of, slots);
        const int tiles = (slots + MOE_BM - 1) / MOE_BM + std::min(E, slots);
        for (int mx = 0; mx < 2; ++mx) {
            const char* kind = mx ? "mxfp4" : "bf16";
            CHECK(cudaMemset(dact, 0xff, (size_t)slots * I * 2));
            const dim3 gu_grid((I + MOE_BN / 2 - 1) / (MOE_BN / 2), tiles), d_grid((HIDDEN + MOE_BN - 1) / MOE_BN, tiles);
            if (mx) {
                gptoss_gemm_gate_up_mxfp4<<<gu_grid, 128>>>(dx_perm, dgu_blocks, dgu_scales, dgu_bias, dmeta, dact);
            } else {
                gptoss_gemm_gate_up<<<gu_grid, 128>>>(dx_perm, dgu_bf16, dgu_bias, dmeta, dact);
            }
            const std::vector<uint16_t> act = finish_and_download(dact, (size_t)slots * I);
            std::vector<uint16_t> by_slot((size_t)slots * I);
            for (int s = 0; s < slots; ++s)
                std::copy_n(&act[(size_t)row_of[s] * I], I, &by_slot[(size_t)s * I]);
            double worst = 0.0;
            const int bad_act = count_mismatches(by_slot, want_act, 2e-3, 8e-3, 5, worst, [&](size_t i, double got, double want) {
                fprintf(stderr, "MISMATCH grouped %s gate_up slot=%zu i=%zu: got %g want %g\n", kind, i / I, i % I, got, want);
            });
            if (mx) {
                gptoss_gemm_down_mxfp4<<<d_grid, 128>>>(dact, dd_blocks, dd_scales, dd_bias, dmeta, dy);
            } else {
                gptoss_gemm_down<<<d_grid, 128>>>(dact, dd_bf16, dd_bias, dmeta, dy);
            }
            gptoss_combine<<<tokens, 256>>>(dy, drow_of, dids, dweights, ddelta);
            const std::vector<float> y = finish_and_download(dy, (size_t)slots * HIDDEN);
            const std::vector<float> delta = finish_and_download(ddelta, (size_t)tokens * HIDDEN);
            int bad_y = 0, bad_delta = 0;
            double worst_y = 0.0;
            for (int s = 0; s < slots; ++s) {
                const int e = want_ids[s], r = row_of[s];
                for (int h = 0; h < HIDDEN; ++h) {
                    double want = from_bf16(down_bias[(size_t)e * HIDDEN + h]);
                    for (int i = 0; i < I; ++i)
                        want += (double)from_bf16(act[(size_t)r * I + i]) * down.values[((size_t)e * HIDDEN + h) * I + i];
                    const double err = std::fabs(y[(size_t)r * HIDDEN + h] - want);
                    if (!(err <= 1e-3 + 1e-4 * std::fabs(want))) ++bad_y;
                    if (err == err) worst_y = std::max(worst_y, err);
                }
            }
            for (int t = 0; t < tokens; ++t) {
                std::vector<int> order(K);
                std::iota(order.begin(), order.end(), 0);
                std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[t * K + a] < ids[t * K + b]; });
                for (int h = 0; h < HIDDEN; ++h) {
                    double want = 0.0;
                    for (int k : order) want += (double)y[(size_t)row_of[t * K + k] * HIDDEN + h] * weights[t * K + k];
                    if (!(std::fabs(delta[(size_t)t * HIDDEN + h] - want) <= 1e-3 + 1e-4 * std::fabs(want))) ++bad_delta;
                }
            }
            printf("RESULT gptoss grouped %s tokens=%d: %s (gate_up %d mismatches, max abs error %.2e; down %d, max abs "
                   "error %.2e; combine %d)\n",
                   kind, tokens, bad_act + bad_y + bad_delta ? "FAIL" : "ok", bad_act, worst, bad_y, worst_y, bad_delta);
            failures += bad_act + bad_y + bad_delta;
        }
        for (void* p : std::initializer_list<void*>{dmeta, dsorted, drow_of, dx_perm, ddelta}) CHECK(cudaFree(p));
    }
    for (void* p : std::initializer_list<void*>{dlogits, dbias, dids, dweights, dx, dgu_bias, dd_bias, dgu_blocks,
                                               dgu_scales, dgu_bf16, dd_blocks, dd_scales, dd_bf16, dact, dy})
        CHECK(cudaFree(p));
    return failures;
}

int main(int argc, char** argv) {
    const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 10) : std::random_device{}();
    std::mt19937_64 rng(seed);
    int failures = 0;
    for (int tokens : {1, 3, 40}) failures += check_tokens(rng, tokens);
    printf("RESULT gptoss-check experts=%d top_k=%d hidden=%d inter=%d seed=%llu: %s (%d failures)\n", E, K, HIDDEN, I,
           (unsigned long long)seed, failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
