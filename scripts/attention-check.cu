// Decode-attention kernel check and benchmark on random data (kernels/attention.cu), built with
// nvcc on the GPU machine by scripts/gpu-check.sh (stage "attention"), once per head
// configuration: the model shapes come in as -D defines, as NVRTC gets them from the backend.
//
// Built with -DKV_FP8=1 it checks the FP8 cache's build of the kernels instead (E4M3 keys and
// values at per-layer scales, scripts/kv-check.cuh), and its test first checks the quantized
// write and the widening against the host's E4M3 rounding. Built with -DATTN_SINKS=1 (gpt-oss)
// the kernels join per-head sinks to every softmax: random ones, one head's dominant and one's
// negligible, against the reference's.
//
//   attention-check test [SEED]   paged_attention + attention_reduce against a float64 CPU
//                                 reference: tokens of several context lengths (a padding token
//                                 included), shuffled block tables, several split bounds; exits 1
//                                 on a mismatch. SEED defaults to a fresh random one (printed).
//   attention-check bench [TARGET [BATCH [CONTEXT]]]
//                                 device copy bandwidth, then K/V read bandwidth of the kernel
//                                 pair for batches 1 to 256 at contexts 1k/4k/16k/32k (every
//                                 token at the full context, the split bound chosen as the
//                                 backend's plan::split_bound does, for TARGET blocks per launch
//                                 when given and above 0, else one wave; only BATCH rows and
//                                 CONTEXT positions when given; several cache copies cycled so
//                                 no launch reads from L2 what the previous one left there),
//                                 launched eagerly and replayed from a CUDA graph with
//                                 programmatic dependent launch (as the decode graphs run it),
//                                 beside the same bytes read by one plain launch in a graph: the
//                                 ceiling for any kernel that reads them in one launch.
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
#include "attention-reference.cuh"

#undef INFINITY
#include "prelude.cuh"
#include "attention.cu"
#include "kv-check.cuh"



static const int ROW_ELEMS = NUM_KV_HEADS * HEAD_DIM;  // elements of one cache slot

// The backend's plan::split_bound with its default budget (plan::split_budget(2048) = 8192),
// for one wave of blocks (the SM count times the kernel's blocks per SM, as the backend asks the
// driver) unless the bench is given another target.
static int target_blocks = 0;
static int split_bound(int tokens, int max_context) {
    const int wanted = std::max(1, (max_context + ATTN_MIN_PARTITION - 1) / ATTN_MIN_PARTITION);
    const int room = std::max(1, 8192 / std::max(1, tokens));
    const int per_split = tokens * NUM_KV_HEADS;
    const int fill = std::max(1, target_blocks / per_split);
    return std::min(wanted, std::min(room, fill));
}

// The device's SM count.
static int sm_count() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    return sms;
}

// One wave of paged_attention blocks on this device.
static int resident_blocks() {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, paged_attention, ATTN_WARPS * 32, 0));
    return sm_count() * per_sm;
}

// Launches `kernel` on `stream`, with programmatic dependent launch when `programmatic` is set
// (as the backend launches every kernel on Hopper).
template <typename... Params, typename... Args>
static void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                          bool programmatic, Args... args) {
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = programmatic ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// Per token and KV head, the blocks of a launch that have finished (zero between launches; the
// kernel's merging block resets its count), for up to 256 tokens.
static int* merge_counts() {
    static int* counts = nullptr;
    if (!counts) {
        CHECK(cudaMalloc(&counts, (size_t)256 * NUM_KV_HEADS * 4));
        CHECK(cudaMemset(counts, 0, (size_t)256 * NUM_KV_HEADS * 4));
    }
    return counts;
}

// The layer's k and v scales on the device (KV_K_SCALE, KV_V_SCALE).
static float* kv_scales() {
    static float* scales = nullptr;
    if (!scales) scales = upload(std::vector<float>{KV_K_SCALE, KV_V_SCALE});
    return scales;
}

static void launch(const uint16_t* q, const kv_host* k, const kv_host* v, const int* tables,
                   const int* max_blocks, const int* rows, const int* positions, float* acc,
                   float* ml, int tokens, int splits, float scale, uint16_t* out,
                   cudaStream_t stream = 0, bool programmatic = false) {
    launch_kernel(paged_attention, dim3(tokens, NUM_KV_HEADS, splits), dim3(ATTN_WARPS * 32), stream, programmatic,
                  q, reinterpret_cast<const kv_t*>(k), reinterpret_cast<const kv_t*>(v), kv_scales(), device_sinks,
                  tables, max_blocks, rows, positions, acc, ml, merge_counts(), splits, scale, out);
    // As the backend launches it: with one partition per token, or at most ATTN_MERGE_SPLITS,
    // the kernel wrote the output.
    if (splits > ATTN_MERGE_SPLITS)
        launch_kernel(attention_reduce, dim3(tokens, NUM_Q_HEADS), dim3(ATTN_REDUCE_THREADS), stream, programmatic,
                      acc, ml, positions, device_sinks, splits, /*all_splits=*/0, out);
}

// The ceiling for one launch that reads `n` 16-byte words of each of `a` and `b` (the K and V a
// decode launch reads), started as the backend starts a kernel: every SM's share in flight at
// once, four loads per thread before any is used. `sink` keeps the loads from being removed.
__global__ void __launch_bounds__(256) read_words(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                                  size_t n, unsigned int* sink) {
    await_previous_kernels();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned int x = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < 2 * n; i += 4 * stride) {
        uint4 w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const size_t j = i + u * stride;
            w[u] = j < 2 * n ? __ldg(j < n ? a + j : b + (j - n)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) x ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
    }
    if (x == 0x9e3779b9u) *sink = x;
}

// Seconds per call of `body(i)` for i in [0, iters), captured as one CUDA graph on `stream`
// (replayed once to warm up, then timed).
template <typename Body>
static double graph_seconds(cudaStream_t stream, int iters, Body body) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; ++i) body(i);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    StreamTimer timer(stream);
    CHECK(cudaGraphLaunch(exec, stream));
    const double secs = timer.seconds();
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    return secs / iters;
}

static int test(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    int failures = 0;
#if KV_FP8
    failures += check_kv_conversions(rng);
#endif
    // FP8 keys and values span most of E4M3's range at their scales (the outputs so reach 3).
    const float k_gain = KV_FP8 ? 4.0f : 1.0f;
    const float v_gain = KV_FP8 ? 3.0f : 1.0f;
    // Contexts: the first position, inside one block, block edges, a window's edge, long.
    const std::vector<int> positions = {0, 5, 15, 16, 37, 300, 999, 1500};
    const int tokens = (int)positions.size() + 1;  // the last token is padding
    const int max_pos = 1500;
    const int max_blocks = max_pos / KV_BLOCK + 1;
    const int pool = tokens * max_blocks + 7;
    std::vector<int> perm(pool);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> tables((size_t)tokens * max_blocks);
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = perm[i];
    std::vector<int> rows(tokens), pos(tokens);
    for (int t = 0; t < tokens; ++t) {
        rows[t] = t;
        pos[t] = t < (int)positions.size() ? positions[t] : 200;
    }
    rows[tokens - 1] = -1;
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    const float q_gain = 3.0f;  // peaked softmaxes as well as flat ones
    std::vector<uint16_t> q((size_t)tokens * NUM_Q_HEADS * HEAD_DIM);
    std::vector<kv_host> k((size_t)pool * KV_BLOCK * ROW_ELEMS), v(k.size());
    for (auto& x : q) x = to_bf16(q_gain * uni(rng));
    for (auto& x : k) x = kv_encode(k_gain * uni(rng), KV_K_SCALE);
    for (auto& x : v) x = kv_encode(v_gain * uni(rng), KV_V_SCALE);
#if SLIDING_WINDOW > 0
    // The blocks before the one a token's window starts in are given back by the engine (its
    // table holds 0 there: another sequence's block). Here they name a spare block of NaN, so
    // using any of them shows as a mismatch.
    {
        const int freed = perm[pool - 1];
        for (size_t e = 0; e < (size_t)KV_BLOCK * ROW_ELEMS; ++e)
            k[(size_t)freed * KV_BLOCK * ROW_ELEMS + e] = v[(size_t)freed * KV_BLOCK * ROW_ELEMS + e] = KV_NAN;
        for (int t = 0; t < tokens; ++t) {
            if (rows[t] < 0) continue;
            const int first_block = std::max(0, pos[t] + 1 - SLIDING_WINDOW) / KV_BLOCK;
            for (int b = 0; b < first_block; ++b) tables[(size_t)rows[t] * max_blocks + b] = freed;
        }
    }
#endif
    make_sinks(rng, ATTN_SINKS);

    // Reference in float64 over the same inputs (an FP8 cache's at its scales).
    const std::vector<double> ref =
        attention_reference(q, k, v, tables, max_blocks, rows, pos, scale,
                            [](kv_host e) { return kv_decode(e, KV_K_SCALE); },
                            [](kv_host e) { return kv_decode(e, KV_V_SCALE); },
                            ATTN_SINKS ? host_sinks.data() : nullptr);

    uint16_t* dq = upload(q);
    kv_host* dk = upload(k);
    kv_host* dv = upload(v);
    int* dtables = upload(tables);
    int* dmax = upload(std::vector<int>{max_blocks});
    int* drows = upload(rows);
    int* dpos = upload(pos);
    const int max_splits = 64;
    float *dacc, *dml;
    uint16_t* dout;
    CHECK(cudaMalloc(&dacc, (size_t)tokens * NUM_Q_HEADS * max_splits * HEAD_DIM * 4));
    CHECK(cudaMalloc(&dml, (size_t)tokens * NUM_Q_HEADS * max_splits * 2 * 4));
    CHECK(cudaMalloc(&dout, ref.size() * 2));
    for (int splits : {1, 3, 8, 9, split_bound(tokens, max_pos + 1), max_splits}) {
        CHECK(cudaMemset(dout, 0xff, ref.size() * 2));  // NaN everywhere: every write is checked
        launch(dq, dk, dv, dtables, dmax, drows, dpos, dacc, dml, tokens, splits, scale, dout);
        const std::vector<uint16_t> out = finish_and_download(dout, ref.size());
        double worst = 0.0;
        failures += count_mismatches(out, ref, 4e-3 * v_gain, 8e-3, 10 - std::min(failures, 10), worst,
                                     [&](size_t i, double got, double want) {
            const size_t t = i / (NUM_Q_HEADS * HEAD_DIM);
            fprintf(stderr, "MISMATCH splits=%d token=%zu (pos %d) head=%zu dim=%zu: got %g want %g\n", splits, t,
                    pos[t], (i / HEAD_DIM) % NUM_Q_HEADS, i % HEAD_DIM, got, want);
        });
        printf("  splits=%-3d max abs error %.2e\n", splits, worst);
    }
    printf("RESULT attention test cache=%s q=%d kv=%d head_dim=%d window=%d sinks=%d seed=%llu: %s (%d mismatches)\n",
           KV_NAME, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, SLIDING_WINDOW, ATTN_SINKS, (unsigned long long)seed,
           failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}

static int bench(int only_batch, int only_context) {
    const double copy_bw = copy_bandwidth();

    std::vector<int> batches = {1, 2, 4, 6, 8, 16, 20, 64, 256};
    std::vector<int> contexts = {1024, 4096, 16384, 32768};
    if (only_batch > 0) batches = {only_batch};
    if (only_context > 0) contexts = {only_context};
    const size_t max_tokens = (size_t)256 * 32768;
    const size_t pool_elems = max_tokens * ROW_ELEMS;
    kv_host *k, *v;
    CHECK(cudaMalloc(&k, pool_elems * sizeof(kv_host)));
    CHECK(cudaMalloc(&v, pool_elems * sizeof(kv_host)));
    fill_random_kv<<<4096, 256>>>(k, pool_elems, 1);
    fill_random_kv<<<4096, 256>>>(v, pool_elems, 2);
    std::mt19937_64 rng(7);
    make_sinks(rng, ATTN_SINKS);
    const int max_splits = 1024;
    float *acc, *ml;
    uint16_t *q, *out;
    CHECK(cudaMalloc(&acc, (size_t)256 * NUM_Q_HEADS * 8 * HEAD_DIM * 4 + (size_t)max_splits * NUM_Q_HEADS * HEAD_DIM * 4));
    CHECK(cudaMalloc(&ml, (size_t)max_splits * 256 * NUM_Q_HEADS * 2 * 4));
    CHECK(cudaMalloc(&q, (size_t)256 * NUM_Q_HEADS * HEAD_DIM * 2));
    CHECK(cudaMalloc(&out, (size_t)256 * NUM_Q_HEADS * HEAD_DIM * 2));
    fill_random<<<256, 256>>>(q, (size_t)256 * NUM_Q_HEADS * HEAD_DIM, 3, 121);
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned int* sink;
    CHECK(cudaMalloc(&sink, 4));
    const int read_blocks = 8 * sm_count();  // 2,048 threads per SM
    for (int batch : batches) {
        for (int ctx : contexts) {
            const size_t layer_tokens = (size_t)batch * ctx;
            const size_t layer_bytes = layer_tokens * ROW_ELEMS * sizeof(kv_host) * 2;  // K and V
            // Cycle through enough cache copies (layers) to exceed the L2 several times over.
            const int layers = (int)std::max<size_t>(1, std::min<size_t>(max_tokens / layer_tokens, (512u << 20) / layer_bytes + 1));
            const int max_blocks = ctx / KV_BLOCK;
            std::vector<int> perm(layer_tokens / KV_BLOCK);
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            std::vector<int> rows(batch), pos(batch, ctx - 1);
            std::iota(rows.begin(), rows.end(), 0);
            int* dtables = upload(perm);
            int* dmax = upload(std::vector<int>{max_blocks});
            int* drows = upload(rows);
            int* dpos = upload(pos);
            const int splits = split_bound(batch, ctx);
            auto run = [&](int i) {
                const size_t off = (size_t)(i % layers) * layer_tokens * ROW_ELEMS;
                launch(q, k + off, v + off, dtables, dmax, drows, dpos, acc, ml, batch, splits, scale, out);
            };
            for (int i = 0; i < layers + 2; ++i) run(i);
            CHECK(cudaGetLastError());
            const int iters = std::max(20, 2 * layers);
            StreamTimer timer;
            for (int i = 0; i < iters; ++i) run(i);
            const double secs = timer.seconds() / iters;
            const double graph_secs = graph_seconds(stream, iters, [&](int i) {
                const size_t off = (size_t)(i % layers) * layer_tokens * ROW_ELEMS;
                launch(q, k + off, v + off, dtables, dmax, drows, dpos, acc, ml, batch, splits, scale, out, stream, true);
            });
            const size_t words = layer_tokens * ROW_ELEMS * sizeof(kv_host) / 16;  // of K, and of V
            const double read_secs = graph_seconds(stream, iters, [&](int i) {
                const size_t off = (size_t)(i % layers) * layer_tokens * ROW_ELEMS;
                launch_kernel(read_words, dim3(read_blocks), dim3(256), stream, true,
                              reinterpret_cast<const uint4*>(k + off), reinterpret_cast<const uint4*>(v + off), words, sink);
            });
            auto share = [&](double s) { return 100.0 * layer_bytes / s / copy_bw; };
            printf("RESULT attention bench cache=%s q=%d kv=%d head_dim=%d batch=%d context=%d splits=%d: %.1f us, K/V read %.0f GB/s = %.0f%% of copy; "
                   "graph %.1f us = %.0f%%; one read launch of the same bytes (graph) %.1f us = %.0f%%\n",
                   KV_NAME, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, batch, ctx, splits, secs * 1e6, layer_bytes / secs / 1e9, share(secs),
                   graph_secs * 1e6, share(graph_secs), read_secs * 1e6, share(read_secs));
            fflush(stdout);
            CHECK(cudaFree(dtables));
            CHECK(cudaFree(dmax));
            CHECK(cudaFree(drows));
            CHECK(cudaFree(dpos));
        }
    }
    return 0;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "test";
    target_blocks = resident_blocks();
    if (!strcmp(mode, "bench")) {
        if (argc > 2 && atoi(argv[2]) > 0) target_blocks = atoi(argv[2]);
        printf("RESULT attention bench splits for %d blocks per launch\n", target_blocks);
        return bench(argc > 3 ? atoi(argv[3]) : 0, argc > 4 ? atoi(argv[4]) : 0);
    }
    const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 10) : std::random_device{}();
    return test(seed);
}
