// The mixture-of-experts kernels (kernels/moe.cu) against simple host references, built with nvcc
// on the GPU machine by scripts/gpu-check.sh (stage "moe"), once per expert shape (HIDDEN and the
// MOE_* defines; GEMV_* as the backend passes them).
//   moe-check test   for several token counts, fresh random data, every token's routing against
//                    the host's (softmax in double, then libstdc++'s own std::partial_sort or
//                    std::nth_element + sort over (probability, expert) pairs, as torch.topk on
//                    the CPU): rows with an exact tie at the top-k boundary included, and a
//                    padding token; the permutation (segments, active list, every (token, slot)
//                    once, in its expert's segment); the gathered rows byte for byte; the grouped
//                    gate/up + SwiGLU and down products against float64 references; the combine
//                    (and the shared expert's gate) against the weighted sum; at one token,
//                    moe_down_combine_one against the float64 sum of the slots' down products,
//                    weighted, and the shared expert's share. The fused one-block
//                    entry (few tokens) and the separate ones (many) must agree. Exits 1 on a
//                    mismatch.
//   moe-check quick  the same with at most 256 tokens (for compute-sanitizer)
//   moe-check bench  steps of 1, 8, 64, 256 and 2048 tokens of the routed part of a layer (route,
//                    permute, gather, grouped products, combine; one token: moe_down_combine_one,
//                    and the separate kernels for comparison) in a CUDA graph, layers' weights
//                    cycled so every read comes from memory: time per layer and the active
//                    experts' weight bytes per second against the copy bandwidth; the expert
//                    products alone (their share of a step: times the layer count over the step).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "check-common.cuh"

#undef INFINITY
#include "prelude.cuh"
// gemv.cu's inner loops and fp8.cu's conversions without their entry points, as the backend
// compiles the family.
#define GEMV_NO_ENTRIES 1
#include "gemv.cu"
#define FP8_NO_ENTRIES 1
#include "fp8.cu"
#include "moe.cu"
#include "moe-check-common.cuh"

static const int THREADS = GemvShape<1>::warps * 32;
static const int ROWS = GemvShape<1>::rows;
static const int RING = GemvShape<1>::ring_bytes;

// Whether the gate/up product reads x's one row in place (row stride 0): one token after the fused
// routing, which then gathers nothing (as the backend runs a step of one token).
static bool in_place(int t, bool fused) { return fused && t == 1; }

// The gate/up product's rows and their stride.
static const bf16* gate_up_rows(const Buffers& b, int t, bool fused) { return in_place(t, fused) ? b.x : b.x_perm; }
static int gate_up_stride(int t, bool fused) { return in_place(t, fused) ? 0 : H; }

// The expert products alone (gate/up with SwiGLU, then down), after route(b, t, fused).
static void grouped(const Buffers& b, int t, bool fused, const bf16* gate_up, const bf16* down, cudaStream_t stream = 0) {
    const bf16* x = gate_up_rows(b, t, fused);
    const int stride = gate_up_stride(t, fused);
    if (takes_gemm(t)) {
        const int tiles = (t * K + MOE_BM - 1) / MOE_BM + std::min(E, t * K);
        moe_gemm_gate_up<<<dim3((I + MOE_BN / 2 - 1) / (MOE_BN / 2), tiles), 128, 0, stream>>>(x, gate_up, b.meta,
                                                                                                b.h_perm, stride);
        moe_gemm_down<<<dim3((H + MOE_BN - 1) / MOE_BN, tiles), 128, 0, stream>>>(b.h_perm, down, b.meta, b.y_perm);
    } else {
        const int active = std::min(E, t * K);
        moe_gate_up<<<dim3(I / (ROWS / 2), active), THREADS, RING, stream>>>(x, gate_up, b.meta, b.h_perm, stride);
        moe_down<<<dim3((H + ROWS - 1) / ROWS, active), THREADS, RING, stream>>>(b.h_perm, down, b.meta, b.y_perm);
    }
}

// The products and the combine (the backend's path for more than one token).
static void products(const Buffers& b, int t, bool fused, const bf16* gate_up, const bf16* down, bool shared,
                     cudaStream_t stream = 0) {
    grouped(b, t, fused, gate_up, down, stream);
    moe_combine<<<t, 256, 0, stream>>>(b.y_perm, b.row_of, b.weights, b.logits, shared ? b.shared : nullptr,
                                       b.delta);
}

// The down product with the combine for a step of one token (moe_down_combine_one), after the
// gate/up product, into b.delta.
static void down_combine_one(const Buffers& b, const bf16* down, bool shared, cudaStream_t stream = 0) {
    const int warps = std::min(K, 8);
    moe_down_combine_one<<<(H + 7) / 8, 32 * warps, 0, stream>>>(b.h_perm, down, b.ids, b.row_of, b.weights, b.logits,
                                                                 shared ? b.shared : nullptr, b.delta);
}

// The one-token path as the backend runs it after the fused routing: the small-M gate/up product
// reading x in place, then the fused down and combine.
static void one_token(const Buffers& b, const bf16* gate_up, const bf16* down, bool shared, cudaStream_t stream = 0) {
    moe_gate_up<<<dim3(I / (ROWS / 2), std::min(E, K)), THREADS, RING, stream>>>(b.x, gate_up, b.meta, b.h_perm, 0);
    down_combine_one(b, down, shared, stream);
}

// The host's routing of one row of logits: torch.topk's order on the CPU (libstdc++'s algorithms).
static void host_route(const float* logits, std::vector<int>& ids, std::vector<double>& weights) {
    double top = -1e300;
    for (int e = 0; e < E; ++e) top = std::max(top, (double)logits[e]);
    std::vector<double> p(E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += p[e] = std::exp(logits[e] - top);
    std::vector<std::pair<float, int>> q(E);
    for (int e = 0; e < E; ++e) q[e] = {(float)(p[e] / sum), e};
    const auto before = [](const std::pair<float, int>& a, const std::pair<float, int>& b) { return a.first > b.first; };
    if (K * 64 <= E) {
        std::partial_sort(q.begin(), q.begin() + K, q.end(), before);
    } else {
        std::nth_element(q.begin(), q.begin() + K - 1, q.end(), before);
        std::sort(q.begin(), q.begin() + K - 1, before);
    }
    ids.resize(K);
    weights.resize(K);
    double total = 0;
    for (int s = 0; s < K; ++s) total += p[q[s].second] / sum;
    for (int s = 0; s < K; ++s) {
        ids[s] = q[s].second;
        weights[s] = (p[q[s].second] / sum) / (MOE_RENORMALIZE ? total : 1.0);
    }
}

static int test(int t, bool fused, std::mt19937& rng, const Buffers& b, const bf16* d_gate_up, const bf16* d_down,
                const std::vector<uint16_t>& gate_up, const std::vector<uint16_t>& down) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> logits((size_t)t * MOE_LOGITS);
    for (auto& v : logits) v = normal(rng);
    // Ties at the top-k boundary: in every third token, the expert ranked k + 1 takes the k-th's
    // logit (so their probabilities are equal); token 1 (if any) is padding.
    int ties = 0;
    for (int tok = 0; tok < t && K < E; tok += 3) {
        float* row = &logits[(size_t)tok * MOE_LOGITS];
        std::vector<int> order(E);
        for (int e = 0; e < E; ++e) order[e] = e;
        std::sort(order.begin(), order.end(), [&](int a, int c) { return row[a] > row[c]; });
        row[order[K]] = row[order[K - 1]];
        ++ties;
    }
    std::vector<int> tokens(t);
    for (int i = 0; i < t; ++i) tokens[i] = i == 1 ? -1 : i;
    std::vector<uint16_t> x((size_t)t * H);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (auto& v : x) v = to_bf16(uniform(rng));
    std::vector<float> shared((size_t)t * H);
    for (auto& v : shared) v = uniform(rng);
    CHECK(cudaMemcpy(b.logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.tokens, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.shared, shared.data(), shared.size() * 4, cudaMemcpyHostToDevice));
    route(b, t, fused);
    products(b, t, fused, d_gate_up, d_down, MOE_SHARED_INTER > 0);
    const size_t rows = (size_t)t * K;
    auto ids = finish_and_download(b.ids, rows);
    auto weights = finish_and_download(b.weights, rows);
    auto meta = finish_and_download(b.meta, MOE_META_WORDS);
    auto sorted_tokens = finish_and_download(b.sorted_tokens, rows);
    auto row_of = finish_and_download(b.row_of, rows);
    auto x_perm = finish_and_download(b.x_perm, rows * H);
    // One token after the fused routing: nothing was gathered (the product read x in place), so
    // the checks below take x's row for every slot.
    if (in_place(t, fused)) {
        for (size_t r = 0; r < rows; ++r) memcpy(&x_perm[r * H], x.data(), H * 2);
    }
    auto h_perm = finish_and_download(b.h_perm, rows * I);
    auto y_perm = finish_and_download(b.y_perm, rows * H);
    auto delta = finish_and_download(b.delta, (size_t)t * H);
    int bad = 0;
    const auto fail = [&](const char* what, int tok, double got, double want) {
        if (bad++ < 10) fprintf(stderr, "t=%d %s: token %d: got %g, want %g\n", t, what, tok, got, want);
    };
    // Routing.
    for (int tok = 0; tok < t; ++tok) {
        if (tokens[tok] < 0) continue;
        std::vector<int> want_ids;
        std::vector<double> want_w;
        host_route(&logits[(size_t)tok * MOE_LOGITS], want_ids, want_w);
        std::vector<std::pair<int, double>> got, want;
        for (int s = 0; s < K; ++s) {
            got.push_back({ids[tok * K + s], weights[tok * K + s]});
            want.push_back({want_ids[s], want_w[s]});
        }
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        for (int s = 0; s < K; ++s) {
            if (got[s].first != want[s].first) fail("expert", tok, got[s].first, want[s].first);
            else if (std::fabs(got[s].second - want[s].second) > 1e-5) fail("weight", tok, got[s].second, want[s].second);
        }
    }
    // Permutation.
    std::vector<int> counts(E, 0);
    for (size_t i = 0; i < rows; ++i) counts[ids[i]]++;
    int offset = 0, active = 0;
    for (int e = 0; e < E; ++e) {
        if (meta[e] != offset) fail("segment offset", e, meta[e], offset);
        if (counts[e] > 0) {
            if (meta[MOE_META_ACTIVE + active] != e) fail("active expert", active, meta[MOE_META_ACTIVE + active], e);
            ++active;
        }
        offset += counts[e];
    }
    if (meta[E] != (int)rows) fail("rows", 0, meta[E], rows);
    if (meta[MOE_META_COUNT] != active) fail("active experts", 0, meta[MOE_META_COUNT], active);
    std::vector<int> seen(rows, 0);
    for (size_t i = 0; i < rows; ++i) {
        const int r = row_of[i], e = ids[i];
        if (r < 0 || r >= (int)rows) { fail("row", i, r, -1); continue; }
        seen[r]++;
        if (r < meta[e] || r >= meta[e + 1]) fail("row outside its expert's segment", i, r, meta[e]);
        if (sorted_tokens[r] != (int)(i / K)) fail("row's token", i, sorted_tokens[r], i / K);
        if (!in_place(t, fused) && memcmp(&x_perm[(size_t)r * H], &x[(i / K) * H], H * 2) != 0) fail("gathered row", i, r, r);
    }
    for (size_t r = 0; r < rows; ++r) if (seen[r] != 1) fail("row used", r, seen[r], 1);
    // Grouped products: each permuted row against its expert (h from x, y from the kernel's h).
    // The GEMM's tile list: each expert's first tile, the total.
    {
        int tiles = 0;
        for (int e = 0; e <= E; ++e) {
            if (meta[MOE_META_TILES + e] != tiles) fail("first tile", e, meta[MOE_META_TILES + e], tiles);
            if (e < E) tiles += (counts[e] + MOE_BM - 1) / MOE_BM;
        }
    }
    double worst_h = 0, worst_y = 0, worst_d = 0;
    // A sample of at most ~48 rows: the float64 reference is slow on the host.
    const size_t stride = std::max<size_t>(1, rows / 48);
    for (size_t i = 0; i < rows && bad == 0; i += stride) {
        const int r = row_of[i], e = ids[i];
        const uint16_t* gu = &gate_up[(size_t)e * 2 * I * H];
        const uint16_t* dn = &down[(size_t)e * H * I];
        for (int j = 0; j < I; ++j) {
            double g = 0, u = 0;
            for (int k = 0; k < H; ++k) {
                const double xv = from_bf16(x_perm[(size_t)r * H + k]);
                g += xv * from_bf16(gu[(size_t)j * H + k]);
                u += xv * from_bf16(gu[(size_t)(I + j) * H + k]);
            }
            const double want = silu(g) * u, got = from_bf16(h_perm[(size_t)r * I + j]);
            const double err = std::fabs(got - want);
            worst_h = std::max(worst_h, err);
            if (!(err <= 1e-2 + 1e-2 * std::fabs(want))) fail("gate/up + SwiGLU", i, got, want);
        }
        for (int n = 0; n < H; ++n) {
            double y = 0;
            for (int k = 0; k < I; ++k) y += from_bf16(h_perm[(size_t)r * I + k]) * from_bf16(dn[(size_t)n * I + k]);
            const double err = std::fabs(y_perm[(size_t)r * H + n] - y);
            worst_y = std::max(worst_y, err);
            if (!(err <= 1e-3 + 1e-3 * std::fabs(y))) fail("down", i, y_perm[(size_t)r * H + n], y);
        }
    }
    // Combine.
    for (int tok = 0; tok < t && bad == 0; ++tok) {
        const double scale = MOE_SHARED_INTER > 0
            ? 1.0 / (1.0 + std::exp(-(double)logits[(size_t)tok * MOE_LOGITS + E])) : 0.0;
        for (int n = 0; n < H; ++n) {
            double want = scale * (MOE_SHARED_INTER > 0 ? shared[(size_t)tok * H + n] : 0.0);
            for (int s = 0; s < K; ++s) want += (double)weights[tok * K + s] * y_perm[(size_t)row_of[tok * K + s] * H + n];
            const double err = std::fabs(delta[(size_t)tok * H + n] - want);
            worst_d = std::max(worst_d, err);
            if (!(err <= 1e-5 + 1e-5 * std::fabs(want))) fail("combine", tok, delta[(size_t)tok * H + n], want);
        }
    }
    // One token: moe_down_combine_one from the same h_perm, against the float64 weighted sum of
    // each slot's down product and the shared expert's share.
    double worst_one = 0;
    if (t == 1 && bad == 0) {
        down_combine_one(b, d_down, MOE_SHARED_INTER > 0);
        auto one = finish_and_download(b.delta, (size_t)H);
        const double scale = MOE_SHARED_INTER > 0 ? 1.0 / (1.0 + std::exp(-(double)logits[E])) : 0.0;
        for (int n = 0; n < H; ++n) {
            double want = scale * (MOE_SHARED_INTER > 0 ? shared[n] : 0.0), size = std::fabs(want);
            for (int s = 0; s < K; ++s) {
                const uint16_t* dn = &down[(size_t)ids[s] * H * I + (size_t)n * I];
                double y = 0;
                for (int k = 0; k < I; ++k) y += from_bf16(h_perm[(size_t)row_of[s] * I + k]) * from_bf16(dn[k]);
                want += (double)weights[s] * y;
                size += std::fabs((double)weights[s] * y);
            }
            const double err = std::fabs(one[n] - want);
            worst_one = std::max(worst_one, err);
            if (!(err <= 1e-3 + 1e-3 * size)) fail("down + combine, one token", n, one[n], want);
        }
    }
    printf("RESULT moe test E=%d K=%d H=%d I=%d t=%d %s, %s products: %d boundary ties, %d active experts, max err h %.2e y %.2e delta %.2e one-token down+combine %.2e: %s\n",
           E, K, H, I, t, fused ? "fused" : "separate", takes_gemm(t) ? "tensor-core tile" : "small-M", ties, active, worst_h, worst_y, worst_d, worst_one, bad ? "FAIL" : "ok");
    return bad;
}

// `quick`: at most 256 tokens (for compute-sanitizer; still both product paths).
static int run_tests(bool quick) {
    std::mt19937 rng(44);
    const int max_tokens = quick ? 256 : 300;
    Buffers b = allocate(max_tokens, true);
    std::vector<uint16_t> gate_up((size_t)E * 2 * I * H), down((size_t)E * H * I);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (auto& v : gate_up) v = to_bf16(normal(rng));
    for (auto& v : down) v = to_bf16(normal(rng));
    bf16* d_gate_up = upload(gate_up);
    bf16* d_down = upload(down);
    CHECK(cudaFuncSetAttribute(moe_gate_up, cudaFuncAttributeMaxDynamicSharedMemorySize, RING));
    CHECK(cudaFuncSetAttribute(moe_down, cudaFuncAttributeMaxDynamicSharedMemorySize, RING));
    int bad = 0;
    for (int t : {1, 3, 8}) bad += test(t, true, rng, b, d_gate_up, d_down, gate_up, down);
    for (int t : {1, 9, 37, max_tokens}) bad += test(t, false, rng, b, d_gate_up, d_down, gate_up, down);
    return bad ? 1 : 0;
}

static int run_bench() {
    const double copy = copy_bandwidth();
    const int layers = 4;
    const size_t gate_up_elems = (size_t)E * 2 * I * H, down_elems = (size_t)E * H * I;
    std::vector<bf16*> gate_up(layers), down(layers);
    for (int l = 0; l < layers; ++l) {
        CHECK(cudaMalloc(&gate_up[l], gate_up_elems * 2));
        CHECK(cudaMalloc(&down[l], down_elems * 2));
        fill_random<<<1024, 256>>>(gate_up[l], gate_up_elems, 17 + l, 118);
        fill_random<<<1024, 256>>>(down[l], down_elems, 71 + l, 118);
    }
    CHECK(cudaFuncSetAttribute(moe_gate_up, cudaFuncAttributeMaxDynamicSharedMemorySize, RING));
    CHECK(cudaFuncSetAttribute(moe_down, cudaFuncAttributeMaxDynamicSharedMemorySize, RING));
    const int max_tokens = 2048;
    Buffers b = allocate(max_tokens, true);
    bench_inputs(b, max_tokens);
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    // Seconds per layer of `record(l)` in a CUDA graph (weight copy l cycled through the layers).
    const auto per_layer = [&](auto record) { return graph_seconds_per_layer(stream, layers, record); };
    for (int t : {1, 8, 64, 256, 2048}) {
        // The routed part as the backend runs it (one token: the fused down and combine).
        const double layer = per_layer([&](int l) {
            route(b, t, t <= 8, stream);
            if (t == 1) one_token(b, gate_up[l], down[l], false, stream);
            else products(b, t, t <= 8, gate_up[l], down[l], false, stream);
        });
        // The expert products alone (routing done once before), for their share of a step (one
        // token: with the combine fused into the down product).
        const double experts = per_layer([&](int l) {
            if (t == 1) one_token(b, gate_up[l], down[l], false, stream);
            else grouped(b, t, t <= 8, gate_up[l], down[l], stream);
        });
        auto meta = finish_and_download(b.meta, MOE_META_WORDS);
        const int active = meta[MOE_META_COUNT];
        const double bytes = (double)active * 3 * I * H * 2;
        const double flops = 2.0 * t * K * 3.0 * I * H;
        printf("RESULT moe bench E=%d K=%d H=%d I=%d tokens=%d (%s products): %d active experts, %.1f us per layer (routing to combine), "
               "%.0f GB/s of active expert weights = %.0f%% of copy bandwidth, %.1f TFLOP/s; expert products alone %.1f us "
               "(%.0f%% of copy bandwidth)\n",
               E, K, H, I, t, t == 1 ? "one-token" : takes_gemm(t) ? "tensor-core tile" : "small-M", active, layer * 1e6,
               bytes / layer / 1e9, 100.0 * bytes / layer / copy, flops / layer / 1e12, experts * 1e6,
               100.0 * bytes / experts / copy);
        if (t == 1) {
            // The separate down and combine kernels at one token, for comparison.
            const double separate = per_layer([&](int l) {
                route(b, t, true, stream);
                products(b, t, true, gate_up[l], down[l], false, stream);
            });
            printf("RESULT moe bench tokens=1, separate moe_down and moe_combine: %.1f us per layer (%.0f%% of copy bandwidth)\n",
                   separate * 1e6, 100.0 * bytes / separate / copy);
            // Each launch of the one-token layer alone (routing done once before the others).
            const double routing = per_layer([&](int) { route(b, t, true, stream); });
            const double gate = per_layer([&](int l) {
                moe_gate_up<<<dim3(I / (ROWS / 2), std::min(E, K)), THREADS, RING, stream>>>(b.x, gate_up[l], b.meta,
                                                                                             b.h_perm, 0);
            });
            const double down_one = per_layer([&](int l) { down_combine_one(b, down[l], false, stream); });
            const double gate_bytes = (double)K * 2 * I * H * 2, down_bytes = (double)K * I * H * 2;
            printf("RESULT moe bench tokens=1, each launch alone: moe_route_permute %.1f us, moe_gate_up %.1f us (%.0f%% of "
                   "copy), moe_down_combine_one %.1f us (%.0f%% of copy)\n",
                   routing * 1e6, gate * 1e6, 100.0 * gate_bytes / gate / copy, down_one * 1e6,
                   100.0 * down_bytes / down_one / copy);
        }
    }
    return 0;
}

int main(int argc, char** argv) { return moe_check_main(argc, argv, "moe-check", run_tests, run_bench); }
