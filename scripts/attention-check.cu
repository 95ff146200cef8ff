// Decode-attention kernel check and benchmark on random data (kernels/attention.cu), built with
// nvcc on the GPU machine by scripts/gpu-check.sh (stage "attention"), once per head
// configuration: the model shapes come in as -D defines, as NVRTC gets them from the backend.
//
//   attention-check test [SEED]   paged_attention + attention_reduce against a float64 CPU
//                                 reference: tokens of several context lengths (a padding token
//                                 included), shuffled block tables, several split bounds; exits 1
//                                 on a mismatch. SEED defaults to a fresh random one (printed).
//   attention-check bench [TARGET] device copy bandwidth, then K/V read bandwidth of the kernel
//                                 pair for batch 1/16/64/256 at contexts 1k/4k/16k/32k (every
//                                 token at the full context, the split bound chosen as the
//                                 backend's plan::split_bound does, for TARGET blocks per launch
//                                 when given; several cache copies cycled so
//                                 no launch reads from L2 what the previous one left there).
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



static const int ROW_ELEMS = NUM_KV_HEADS * HEAD_DIM;  // elements of one cache slot

// The backend's plan::split_bound with its default budget (plan::split_budget(2048) = 8192) and
// plan::TARGET_BLOCKS (1024) unless the bench is given another target.
static int target_blocks = 1024;
static int split_bound(int tokens, int max_context) {
    const int wanted = std::max(1, (max_context + ATTN_MIN_PARTITION - 1) / ATTN_MIN_PARTITION);
    const int room = std::max(1, 8192 / std::max(1, tokens));
    const int fill = std::max(1, (target_blocks + tokens * NUM_KV_HEADS - 1) / (tokens * NUM_KV_HEADS));
    return std::min(wanted, std::min(room, fill));
}

static void launch(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int* tables,
                   const int* max_blocks, const int* rows, const int* positions, float* acc,
                   float* ml, int tokens, int splits, float scale, uint16_t* out) {
    paged_attention<<<dim3(tokens, NUM_KV_HEADS, splits), ATTN_WARPS * 32>>>(
        q, k, v, tables, max_blocks, rows, positions, acc, ml, splits, scale, out);
    // As the backend launches it: with one partition per token the kernel wrote the output.
    if (splits > 1)
        attention_reduce<<<dim3(tokens, NUM_Q_HEADS), ATTN_REDUCE_THREADS>>>(
            acc, ml, positions, splits, /*all_splits=*/0, out);
}


static int test(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
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
    std::vector<uint16_t> k((size_t)pool * KV_BLOCK * ROW_ELEMS), v(k.size());
    for (auto& x : q) x = to_bf16(q_gain * uni(rng));
    for (auto& x : k) x = to_bf16(uni(rng));
    for (auto& x : v) x = to_bf16(uni(rng));

    // Reference in float64 over the same bf16 inputs.
    const std::vector<double> ref = attention_reference(q, k, v, tables, max_blocks, rows, pos, scale);

    uint16_t* dq = upload(q);
    uint16_t* dk = upload(k);
    uint16_t* dv = upload(v);
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
    int failures = 0;
    for (int splits : {1, 3, 8, split_bound(tokens, max_pos + 1), max_splits}) {
        CHECK(cudaMemset(dout, 0xff, ref.size() * 2));  // NaN everywhere: every write is checked
        launch(dq, dk, dv, dtables, dmax, drows, dpos, dacc, dml, tokens, splits, scale, dout);
        const std::vector<uint16_t> out = finish_and_download(dout, ref.size());
        double worst = 0.0;
        failures += count_mismatches(out, ref, 4e-3, 8e-3, 10 - std::min(failures, 10), worst,
                                     [&](size_t i, double got, double want) {
            const size_t t = i / (NUM_Q_HEADS * HEAD_DIM);
            fprintf(stderr, "MISMATCH splits=%d token=%zu (pos %d) head=%zu dim=%zu: got %g want %g\n", splits, t,
                    pos[t], (i / HEAD_DIM) % NUM_Q_HEADS, i % HEAD_DIM, got, want);
        });
        printf("  splits=%-3d max abs error %.2e\n", splits, worst);
    }
    printf("RESULT attention test q=%d kv=%d head_dim=%d window=%d seed=%llu: %s (%d mismatches)\n",
           NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, SLIDING_WINDOW, (unsigned long long)seed,
           failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}

static int bench() {
    const double copy_bw = copy_bandwidth();
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float ms = 0;

    const std::vector<int> batches = {1, 16, 64, 256};
    const std::vector<int> contexts = {1024, 4096, 16384, 32768};
    const size_t max_tokens = (size_t)256 * 32768;
    const size_t pool_elems = max_tokens * ROW_ELEMS;
    uint16_t *k, *v;
    CHECK(cudaMalloc(&k, pool_elems * 2));
    CHECK(cudaMalloc(&v, pool_elems * 2));
    fill_random<<<4096, 256>>>(k, pool_elems, 1, 121);
    fill_random<<<4096, 256>>>(v, pool_elems, 2, 121);
    std::mt19937_64 rng(7);
    const int max_splits = 1024;
    float *acc, *ml;
    uint16_t *q, *out;
    CHECK(cudaMalloc(&acc, (size_t)256 * NUM_Q_HEADS * 8 * HEAD_DIM * 4 + (size_t)max_splits * NUM_Q_HEADS * HEAD_DIM * 4));
    CHECK(cudaMalloc(&ml, (size_t)max_splits * 256 * NUM_Q_HEADS * 2 * 4));
    CHECK(cudaMalloc(&q, (size_t)256 * NUM_Q_HEADS * HEAD_DIM * 2));
    CHECK(cudaMalloc(&out, (size_t)256 * NUM_Q_HEADS * HEAD_DIM * 2));
    fill_random<<<256, 256>>>(q, (size_t)256 * NUM_Q_HEADS * HEAD_DIM, 3, 121);
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    for (int batch : batches) {
        for (int ctx : contexts) {
            const size_t layer_tokens = (size_t)batch * ctx;
            const size_t layer_bytes = layer_tokens * ROW_ELEMS * 2 * 2;  // K and V
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
            CHECK(cudaEventRecord(e0));
            for (int i = 0; i < iters; ++i) run(i);
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            const double secs = ms * 1e-3 / iters;
            const double bw = layer_bytes / secs;
            printf("RESULT attention bench q=%d kv=%d head_dim=%d batch=%d context=%d splits=%d: %.1f us, K/V read %.0f GB/s = %.0f%% of copy\n",
                   NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, batch, ctx, splits, secs * 1e6, bw / 1e9, 100.0 * bw / copy_bw);
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
    if (!strcmp(mode, "bench")) {
        if (argc > 2) target_blocks = atoi(argv[2]);
        return bench();
    }
    const uint64_t seed = argc > 2 ? strtoull(argv[2], nullptr, 10) : std::random_device{}();
    return test(seed);
}
