// Prefill-attention kernel check and benchmark on random data (kernels/prefill_attention.cu),
// built with nvcc on the GPU machine by scripts/gpu-check.sh (stage "prefillattn"), once per head
// configuration: the model shapes come in as -D defines, as NVRTC gets them from the backend.
//
//   prefill-check test [SEED]   prefill_attention against a float64 CPU reference: a whole prompt
//                               of several tiles and key tiles, a chunk at a later start (earlier
//                               keys from the cache), a one-token prompt, shuffled block tables;
//                               as one launch and split 3 and 16 ways over the keys (merged by
//                               attention_reduce); exits 1 on a mismatch. SEED defaults to a fresh
//                               random one.
//                               Built with -DKV_FP8=1 (and F_WGMMA 0, the geometry the backend
//                               gives an FP8 cache) it checks the FP8 cache's build: E4M3 keys
//                               and values at per-layer scales (scripts/kv-check.cuh).
//                               Built with -DATTN_SINKS=1 (gpt-oss) the kernels join per-head
//                               sinks to every softmax: random ones, one head's dominant and one's
//                               negligible, against the reference's.
//   prefill-check bench         the bf16 GEMM rate (cuBLAS, 8192^3) as the ceiling, then the
//                               kernel's rate on its causal FLOPs (4 * head_dim per query head and
//                               attended key) for one prompt of 1k, 8k and 32k tokens, as one
//                               launch, as its last 2048-token chunk and as a last 256-token
//                               chunk, the chunks also split over the keys (starting half a
//                               second after the GEMM timing); then the GEMM rate again.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "check-common.cuh"
#include "attention-reference.cuh"

#ifndef F_WGMMA
#define F_WGMMA 0
#endif
#ifndef F_SHARED
#define F_SHARED 0
#endif

#undef INFINITY
#include "prelude.cuh"
#include "prefill_attention.cu"
#include "attention.cu"
#include "kv-check.cuh"



static const int ROW_ELEMS = NUM_KV_HEADS * HEAD_DIM;  // elements of one cache slot


// One step's prefill rows as the host packs them: per token its row and position, and tiles of
// at most F_TOKENS consecutive tokens of one row.
struct Step {
    std::vector<int> rows, positions, tiles;
    void add(int row, int start, int count) {
        for (int done = 0; done < count; done += F_TOKENS) {
            tiles.push_back((int)rows.size());
            tiles.push_back(std::min(F_TOKENS, count - done));
            for (int i = 0; i < std::min(F_TOKENS, count - done); ++i) {
                rows.push_back(row);
                positions.push_back(start + done + i);
            }
        }
    }
    int tokens() const { return (int)rows.size(); }
    int num_tiles() const { return (int)tiles.size() / 2; }
};

// Partial results for `splits` > 1 (the layout the backend's attention buffers have).
struct Partials {
    float* acc = nullptr;
    float* ml = nullptr;
    Partials(int tokens, int splits) {
        if (splits <= 1) return;
        const size_t parts = (size_t)tokens * NUM_Q_HEADS * splits;
        CHECK(cudaMalloc(&acc, parts * HEAD_DIM * 4));
        CHECK(cudaMalloc(&ml, parts * 2 * 4));
    }
    ~Partials() {
        cudaFree(acc);
        cudaFree(ml);
    }
};

// One attention launch as the backend makes it: the prefill kernel over the step's tiles, split
// `splits` ways over each tile's keys, then (split) the reduction of the partial results.
static void launch(const Step& step, const uint16_t* q, const kv_host* k, const kv_host* v,
                   const int* tables, const int* max_blocks, const int* rows, const int* positions,
                   const int* tiles, float scale, int splits, const Partials& parts, uint16_t* out) {
    static float* kv_scales = upload(std::vector<float>{KV_K_SCALE, KV_V_SCALE});
    static bool opted_in = false;  // shared memory above the default 48 KiB, as the backend sets it
    if (!opted_in && F_SHARED > 0) {
        CHECK(cudaFuncSetAttribute(prefill_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, F_SHARED));
        opted_in = true;
    }
    prefill_attention<<<dim3(step.num_tiles(), NUM_KV_HEADS, splits), F_THREADS, F_SHARED>>>(
        q, reinterpret_cast<const kv_t*>(k), reinterpret_cast<const kv_t*>(v), kv_scales, device_sinks, tables,
        max_blocks, rows, positions, tiles, scale, splits, out, parts.acc, parts.ml);
    if (splits > 1) {
        attention_reduce<<<dim3(step.tokens(), NUM_Q_HEADS), ATTN_REDUCE_THREADS>>>(parts.acc, parts.ml, positions,
                                                                                 device_sinks, splits, 1, out);
    }
}

static int test(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    // Row 0: a whole prompt of 300 tokens; row 1: a chunk of 77 tokens from position 1200 (its
    // first 1200 keys come from the cache); row 2: a one-token prompt; row 3: 64 tokens at 130.
    const int max_pos = 1400;
    const int max_blocks = max_pos / KV_BLOCK + 1;
    const int seqs = 4;
    const int pool = seqs * max_blocks + 5;
    std::vector<int> perm(pool);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> tables((size_t)seqs * max_blocks);
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = perm[i];
    Step step;
    step.add(0, 0, 300);
    step.add(1, 1200, 77);
    step.add(2, 0, 1);
    step.add(3, 130, 64);
    const int tokens = step.tokens();
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    const float q_gain = 3.0f;  // peaked softmaxes as well as flat ones
    std::vector<uint16_t> q((size_t)tokens * NUM_Q_HEADS * HEAD_DIM);
    // FP8 keys and values span most of E4M3's range at their scales (the outputs so reach 3).
    const float k_gain = KV_FP8 ? 4.0f : 1.0f;
    const float v_gain = KV_FP8 ? 3.0f : 1.0f;
    std::vector<kv_host> k((size_t)pool * KV_BLOCK * ROW_ELEMS), v(k.size());
    for (auto& x : q) x = to_bf16(q_gain * uni(rng));
    for (auto& x : k) x = kv_encode(k_gain * uni(rng), KV_K_SCALE);
    for (auto& x : v) x = kv_encode(v_gain * uni(rng), KV_V_SCALE);
    // Slots after each row's last position hold NaN: the kernel must never let them through.
    std::vector<int> last(seqs, -1);
    for (int t = 0; t < tokens; ++t) last[step.rows[t]] = std::max(last[step.rows[t]], step.positions[t]);
    for (int r = 0; r < seqs; ++r) {
        for (int j = last[r] + 1; j < (last[r] / KV_BLOCK + 1) * KV_BLOCK; ++j) {
            const size_t slot = (size_t)tables[(size_t)r * max_blocks + j / KV_BLOCK] * KV_BLOCK + j % KV_BLOCK;
            for (int e = 0; e < ROW_ELEMS; ++e) k[slot * ROW_ELEMS + e] = v[slot * ROW_ELEMS + e] = KV_NAN;
        }
    }
#if SLIDING_WINDOW > 0
    // The blocks before the one the window of a row's first token starts in are given back by the
    // engine (its table holds 0 there: another sequence's block). Here they name a spare block of
    // NaN, so using any of them shows as a mismatch.
    {
        const int freed = perm[pool - 1];
        for (size_t e = 0; e < (size_t)KV_BLOCK * ROW_ELEMS; ++e)
            k[(size_t)freed * KV_BLOCK * ROW_ELEMS + e] = v[(size_t)freed * KV_BLOCK * ROW_ELEMS + e] = KV_NAN;
        std::vector<int> first(seqs, max_pos);
        for (int t = 0; t < tokens; ++t) first[step.rows[t]] = std::min(first[step.rows[t]], step.positions[t]);
        for (int r = 0; r < seqs; ++r) {
            const int first_block = std::max(0, first[r] + 1 - SLIDING_WINDOW) / KV_BLOCK;
            for (int b = 0; b < first_block; ++b) tables[(size_t)r * max_blocks + b] = freed;
        }
    }
#endif

    make_sinks(rng, ATTN_SINKS);
    const std::vector<double> ref =
        attention_reference(q, k, v, tables, max_blocks, step.rows, step.positions, scale,
                            [](kv_host e) { return kv_decode(e, KV_K_SCALE); },
                            [](kv_host e) { return kv_decode(e, KV_V_SCALE); },
                            ATTN_SINKS ? host_sinks.data() : nullptr);

    uint16_t* dq = upload(q);
    kv_host* dk = upload(k);
    kv_host* dv = upload(v);
    int* dtables = upload(tables);
    int* dmax = upload(std::vector<int>{max_blocks});
    int* drows = upload(step.rows);
    int* dpos = upload(step.positions);
    int* dtiles = upload(step.tiles);
    uint16_t* dout;
    CHECK(cudaMalloc(&dout, ref.size() * 2));
    int failures = 0;
    // One launch, then the keys split 3 and 16 ways (more splits than some tiles have key tiles).
    for (int splits : {1, 3, 16}) {
        Partials parts(tokens, splits);
        CHECK(cudaMemset(dout, 0xff, ref.size() * 2));  // NaN everywhere: every write is checked
        launch(step, dq, dk, dv, dtables, dmax, drows, dpos, dtiles, scale, splits, parts, dout);
        const std::vector<uint16_t> out = finish_and_download(dout, ref.size());
        double worst = 0.0;
        // P is rounded to bf16 before P V (as FlashAttention does): a relative 2^-8 per weight.
        const int mismatches = count_mismatches(out, ref, 6e-3 * v_gain, 1.2e-2, 10 - std::min(failures, 10), worst,
                                                [&](size_t i, double got, double want) {
            const size_t t = i / (NUM_Q_HEADS * HEAD_DIM);
            fprintf(stderr, "MISMATCH splits=%d token=%zu (row %d pos %d) head=%zu dim=%zu: got %g want %g\n",
                    splits, t, step.rows[t], step.positions[t], (i / HEAD_DIM) % NUM_Q_HEADS, i % HEAD_DIM, got, want);
        });
        failures += mismatches;
        printf("  splits %d: max abs error %.2e over %d tokens in %d tiles\n", splits, worst, tokens, step.num_tiles());
        printf("RESULT prefill test cache=%s q=%d kv=%d head_dim=%d window=%d sinks=%d splits=%d seed=%llu: %s (%d mismatches)\n",
               KV_NAME, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, SLIDING_WINDOW, ATTN_SINKS, splits, (unsigned long long)seed,
               mismatches ? "FAIL" : "ok", mismatches);
    }
    return failures ? 1 : 0;
}


static int bench() {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float ms = 0;
    // The ceiling: cuBLAS bf16 GEMM with fp32 accumulation, 8192 x 8192 x 8192, timed before the
    // cases (the rate they are compared with) and again after them, when the GPU has been under
    // tensor-core load for a while: the second figure shows how far the clock moved meanwhile.
    const int n = 8192;
    uint16_t *a, *b, *c;
    CHECK(cudaMalloc(&a, (size_t)n * n * 2));
    CHECK(cudaMalloc(&b, (size_t)n * n * 2));
    CHECK(cudaMalloc(&c, (size_t)n * n * 2));
    fill_random<<<4096, 256>>>(a, (size_t)n * n, 11, 121);
    fill_random<<<4096, 256>>>(b, (size_t)n * n, 12, 121);
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 2;
    auto gemm_rate_now = [&]() {
        const float one = 1.0f, zero = 0.0f;
        auto gemm = [&]() {
            return cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                                CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT);
        };
        for (int i = 0; i < 3; ++i) gemm();
        const int iters = 20;
        CHECK(cudaEventRecord(e0));
        for (int i = 0; i < iters; ++i) gemm();
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        return 2.0 * n * n * (double)n * iters / (ms * 1e-3);
    };
    const double gemm_rate = gemm_rate_now();
    printf("RESULT bf16 GEMM rate %.0f TFLOP/s (cuBLAS, %d^3)\n", gemm_rate / 1e12, n);
    // The cases start half a second later: right after those 28 ms of GEMMs the GPU's clocks are
    // still recovering, and the 8k prompt measured 1.21-1.44 ms per launch (47-55% of the rate);
    // half a second later 1.20-1.22 ms in every process, as ncu times one launch alone
    // (docs/cuda-backend.md, "Measured design choices").
    std::this_thread::sleep_for(std::chrono::milliseconds(500));

    const int max_len = 32768;
    const size_t pool_slots = (size_t)max_len;
    kv_host *k, *v;
    uint16_t *q, *out;
    CHECK(cudaMalloc(&k, pool_slots * ROW_ELEMS * sizeof(kv_host)));
    CHECK(cudaMalloc(&v, pool_slots * ROW_ELEMS * sizeof(kv_host)));
    CHECK(cudaMalloc(&q, (size_t)max_len * NUM_Q_HEADS * HEAD_DIM * 2));
    CHECK(cudaMalloc(&out, (size_t)max_len * NUM_Q_HEADS * HEAD_DIM * 2));
    fill_random_kv<<<4096, 256>>>(k, pool_slots * ROW_ELEMS, 1);
    fill_random_kv<<<4096, 256>>>(v, pool_slots * ROW_ELEMS, 2);
    fill_random<<<4096, 256>>>(q, (size_t)max_len * NUM_Q_HEADS * HEAD_DIM, 3, 121);
    std::mt19937_64 rng(7);
    make_sinks(rng, ATTN_SINKS);
    std::vector<int> perm(max_len / KV_BLOCK);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int* dtables = upload(perm);
    int* dmax = upload(std::vector<int>{max_len / KV_BLOCK});
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    // (prompt length, tokens in the launch: the prompt's last ones, key splits): whole prompts,
    // long prompts' last 2,048-token chunks, and the small late chunks a long prompt is cut into
    // while other sequences decode, as one launch and split over the context.
    const int cases[][3] = {{1024, 1024, 1}, {8192, 8192, 1}, {8192, 2048, 1},  {8192, 256, 1},
                            {8192, 256, 4},  {32768, 2048, 1}, {32768, 2048, 2}, {32768, 256, 1},
                            {32768, 256, 8}};
    for (const auto& c : cases) {
        const int len = c[0], chunk = c[1], splits = c[2];
        {
            Step step;
            step.add(0, len - chunk, chunk);
            double attended = 0.0;
            for (int p : step.positions) attended += SLIDING_WINDOW > 0 ? std::min(p + 1, SLIDING_WINDOW) : p + 1;
            const double flops = 4.0 * HEAD_DIM * NUM_Q_HEADS * attended;
            int* drows = upload(step.rows);
            int* dpos = upload(step.positions);
            int* dtiles = upload(step.tiles);
            Partials parts(step.tokens(), splits);
            for (int i = 0; i < 2; ++i)
                launch(step, q, k, v, dtables, dmax, drows, dpos, dtiles, scale, splits, parts, out);
            CHECK(cudaGetLastError());
            const int iters = len >= 32768 ? 5 : 20;
            CHECK(cudaEventRecord(e0));
            for (int i = 0; i < iters; ++i)
                launch(step, q, k, v, dtables, dmax, drows, dpos, dtiles, scale, splits, parts, out);
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            const double secs = ms * 1e-3 / iters;
            const double rate = flops / secs;
            printf("RESULT prefill bench cache=%s q=%d kv=%d head_dim=%d prompt=%d tokens=%d (from %d) splits=%d: %.3f ms per layer, %.0f TFLOP/s = %.0f%% of GEMM\n",
                   KV_NAME, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, len, chunk, len - chunk, splits, secs * 1e3, rate / 1e12,
                   100.0 * rate / gemm_rate);
            fflush(stdout);
            CHECK(cudaFree(drows));
            CHECK(cudaFree(dpos));
            CHECK(cudaFree(dtiles));
        }
    }
    printf("RESULT bf16 GEMM rate after the cases %.0f TFLOP/s (cuBLAS, %d^3)\n", gemm_rate_now() / 1e12, n);
    cublasDestroy(handle);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    return 0;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "test";
    if (!strcmp(mode, "bench")) return bench();
    const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 10) : std::random_device{}();
    return test(seed);
}
