// Helpers shared by the mixture-of-experts harnesses (moe-check.cu, moe-fp8-check.cu), included
// after check-common.cuh and kernels/moe.cu: the expert shape (MOE_* and HIDDEN defines), the
// device buffers of a step, the routing launches, the host's SwiGLU, the bench's routing inputs
// and its timing of a layer in a CUDA graph, and main's dispatch on the mode.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "check-common.cuh"

static const int K = MOE_TOP_K;
static const int E = MOE_EXPERTS;
static const int H = HIDDEN;
static const int I = MOE_INTER;

// A step's device buffers. `shared` (the shared expert's output) only where allocate was asked
// for it; `static_gate_up` and `static_down` (FP8 experts' static input scales) are set by the
// FP8 harness; the ones not used are null.
struct Buffers {
    float* logits;
    int* tokens;
    int* ids;
    float* weights;
    int* meta;
    int* sorted_tokens;
    int* row_of;
    bf16* x;
    bf16* x_perm;
    bf16* h_perm;
    float* y_perm;
    float* shared;
    float* delta;
    float* static_gate_up;
    float* static_down;
};

static Buffers allocate(int max_tokens, bool with_shared) {
    Buffers b;
    const size_t rows = (size_t)max_tokens * K;
    CHECK(cudaMalloc(&b.logits, (size_t)max_tokens * MOE_LOGITS * 4));
    CHECK(cudaMalloc(&b.tokens, (size_t)max_tokens * 4));
    CHECK(cudaMalloc(&b.ids, rows * 4));
    CHECK(cudaMalloc(&b.weights, rows * 4));
    CHECK(cudaMalloc(&b.meta, MOE_META_WORDS * 4));
    CHECK(cudaMalloc(&b.sorted_tokens, rows * 4));
    CHECK(cudaMalloc(&b.row_of, rows * 4));
    CHECK(cudaMalloc(&b.x, (size_t)max_tokens * H * 2));
    CHECK(cudaMalloc(&b.x_perm, rows * H * 2));
    CHECK(cudaMalloc(&b.h_perm, rows * I * 2));
    CHECK(cudaMalloc(&b.y_perm, rows * H * 4));
    b.shared = nullptr;
    if (with_shared) CHECK(cudaMalloc(&b.shared, (size_t)max_tokens * H * 4));
    CHECK(cudaMalloc(&b.delta, (size_t)max_tokens * H * 4));
    b.static_gate_up = nullptr;
    b.static_down = nullptr;
    return b;
}

// Routing, permutation and gather: the fused entry for few tokens (`fused`), else the three.
static void route(const Buffers& b, int t, bool fused, cudaStream_t stream = 0) {
    if (fused) {
        moe_route_permute<<<1, MOE_ROUTE_WARPS * 32, 0, stream>>>(b.logits, b.tokens, b.ids, b.weights, b.meta,
                                                                  b.sorted_tokens, b.row_of, b.x, b.x_perm, t);
    } else {
        moe_route<<<(t + MOE_ROUTE_WARPS - 1) / MOE_ROUTE_WARPS, MOE_ROUTE_WARPS * 32, 0, stream>>>(
            b.logits, b.tokens, b.ids, b.weights, t);
        moe_permute<<<1, 1024, 0, stream>>>(b.ids, b.meta, b.sorted_tokens, b.row_of, t);
        moe_gather<<<std::min(t * K, 4096), 256, 0, stream>>>(b.x, b.sorted_tokens, b.x_perm, t);
    }
}

// The grouped products: the tensor-core tiles from 16 rows per expert on average (as the backend
// chooses, src/backend/cuda/backend/moe.rs), else the small-M loops.
static bool takes_gemm(int t) { return t * K >= 16 * E; }

static double silu(double g) { return g / (1.0 + std::exp(-g)); }

// The bench's routing inputs for `max_tokens` tokens: normal logits (seed 7), every token real,
// random bf16 rows (fill_random, magnitudes in [2^-6, 1)); waits for the fill.
static void bench_inputs(const Buffers& b, int max_tokens) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> logits((size_t)max_tokens * MOE_LOGITS);
    for (auto& v : logits) v = normal(rng);
    std::vector<int> tokens(max_tokens);
    for (int i = 0; i < max_tokens; ++i) tokens[i] = i;
    CHECK(cudaMemcpy(b.logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.tokens, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
    fill_random<<<256, 256>>>(b.x, (size_t)max_tokens * H, 3, 121);
    CHECK(cudaDeviceSynchronize());
}

// Seconds per layer of `record(l)` captured 16 times in one graph on `stream` (repetition i takes
// weight copy l = i % layers, so every read comes from memory): 3 warm-up launches, then 10 timed.
template <typename Record>
static double graph_seconds_per_layer(cudaStream_t stream, int layers, Record record) {
    const int reps = 16;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; ++i) record(i % layers);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int w = 0; w < 3; ++w) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    const int launches = 10;
    StreamTimer timer(stream);
    for (int w = 0; w < launches; ++w) CHECK(cudaGraphLaunch(exec, stream));
    const double seconds = timer.seconds() / launches / reps;
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    return seconds;
}

// main's modes: test (the default), quick (run_tests(true)), bench; else the usage line for `name`.
static int moe_check_main(int argc, char** argv, const char* name, int (*run_tests)(bool), int (*run_bench)()) {
    const char* mode = argc > 1 ? argv[1] : "test";
    if (strcmp(mode, "test") == 0) return run_tests(false);
    if (strcmp(mode, "quick") == 0) return run_tests(true);
    if (strcmp(mode, "bench") == 0) return run_bench();
    fprintf(stderr, "usage: %s test|quick|bench\n", name);
    return 2;
}
