// Sampling kernel check and benchmark (kernels/sampling.cu), built with nvcc on the GPU machine
// by scripts/gpu-check.sh (stage "sampling") at the 8B model's vocabulary (-DVOCAB=128256), once
// from .gpu/kernels and, when .gpu/sampling-old.cu is there, once from that earlier kernel:
//
//   sampling-check draws FILE   samples fixed rows of logits in four shapes (near-uniform,
//                               peaked, peaked in steps of exact ties, sharper still) in seven
//                               sampling modes (one under a grammar mask, one with penalties and
//                               biases), three seeds each, some rows with logprobs, and writes
//                               every output word to FILE: two builds whose draws must agree are
//                               compared byte for byte (cmp).
//   sampling-check bench        microseconds per launch for 1, 8, 64 and 256 peaked rows in three
//                               modes (greedy; temperature 1; temperature 0.8 with top-k, top-p,
//                               min-p and penalties), launched back to back and timed with events.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check-common.cuh"

#define MAX_TOP_LOGPROBS 20
#define SAMPLE_PARAMS 16
#undef INFINITY
#include "prelude.cuh"
#include "sampling.cu"

static int float_bits(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}

// One row's sampling parameters and its lists (penalty pairs, bias pairs, mask words).
struct Mode {
    const char* name;
    float temperature, top_p, min_p, presence, frequency, repetition;
    int top_k;
    bool biases, mask;
};

static const Mode MODES[] = {
    {"greedy", 0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0, false, false},
    {"T=1", 1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0, false, false},
    {"T=0.7 top_k=50", 0.7f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 50, false, false},
    {"T=1 top_p=0.9", 1.0f, 0.9f, 0.0f, 0.0f, 0.0f, 1.0f, 0, false, false},
    {"T=1 min_p=0.05", 1.0f, 1.0f, 0.05f, 0.0f, 0.0f, 1.0f, 0, false, false},
    {"T=0.8 top_k=40 top_p=0.95 min_p=0.02 penalties biases", 0.8f, 0.95f, 0.02f, 0.2f, 0.3f, 1.2f, 40, true, false},
    {"T=1.5 top_p=0.5 mask", 1.5f, 0.5f, 0.0f, 0.0f, 0.0f, 1.0f, 0, false, true},
};
static const int NUM_MODES = sizeof(MODES) / sizeof(MODES[0]);

// Rows of logits in four shapes: 0 near-uniform N(0, 1); 1 peaked, N(0, 1) * 6; 2 the same in
// steps of 0.5 (exact ties in every value group); 3 sharper still, N(0, 1) * 12.
static std::vector<float> make_logits(int rows, uint64_t seed, bool peaked_only) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> logits((size_t)rows * VOCAB);
    for (int r = 0; r < rows; ++r) {
        const int shape = peaked_only ? 1 : r % 4;
        for (int i = 0; i < VOCAB; ++i) {
            float v = normal(rng);
            if (shape >= 1) v *= shape == 3 ? 12.0f : 6.0f;
            if (shape == 2) v = std::round(v * 2.0f) / 2.0f;
            logits[(size_t)r * VOCAB + i] = v;
        }
    }
    return logits;
}

// Packs the parameter words and lists of `rows` rows; row r takes MODES[mode_of(r)].
template <typename ModeOf>
static void pack(int rows, ModeOf mode_of, std::vector<int>& params, std::vector<int>& lists) {
    params.assign((size_t)rows * SAMPLE_PARAMS, 0);
    lists.clear();
    for (int r = 0; r < rows; ++r) {
        const Mode& m = MODES[mode_of(r)];
        int* p = &params[(size_t)r * SAMPLE_PARAMS];
        p[P_TEMPERATURE] = float_bits(m.temperature);
        p[P_TOP_K] = m.top_k;
        p[P_TOP_P] = float_bits(m.top_p);
        p[P_MIN_P] = float_bits(m.min_p);
        p[P_PRESENCE] = float_bits(m.presence);
        p[P_FREQUENCY] = float_bits(m.frequency);
        p[P_REPETITION] = float_bits(m.repetition);
        const uint64_t seed = 1000 + r, draw = 7 * r + 3;
        p[P_SEED_LO] = (int)(uint32_t)seed;
        p[P_SEED_HI] = (int)(uint32_t)(seed >> 32);
        p[P_DRAW_LO] = (int)(uint32_t)draw;
        p[P_DRAW_HI] = (int)(uint32_t)(draw >> 32);
        // Penalties: eight distinct tokens (their low three bits differ) generated 0 to 3 times.
        p[P_PENALTY_AT] = (int)lists.size();
        p[P_PENALTY_LEN] = m.repetition != 1.0f || m.frequency != 0.0f || m.presence != 0.0f ? 8 : 0;
        for (int j = 0; j < p[P_PENALTY_LEN]; ++j) {
            lists.push_back((r * 131 + j * 9973) % VOCAB / 8 * 8 + j);
            lists.push_back(j % 4);
        }
        // Biases: +5 on one token, -3 on another (sorted by token).
        p[P_BIAS_AT] = (int)lists.size();
        p[P_BIAS_LEN] = m.biases ? 2 : 0;
        if (m.biases) {
            lists.push_back((r * 17) % 1000);
            lists.push_back(float_bits(5.0f));
            lists.push_back(2000 + (r * 29) % 1000);
            lists.push_back(float_bits(-3.0f));
        }
        // Mask: about a third of the vocabulary allowed.
        p[P_MASK_AT] = m.mask ? (int)lists.size() : -1;
        if (m.mask) {
            for (int w = 0; w < (VOCAB + 31) / 32; ++w) {
                uint32_t bits = 0;
                for (int b = 0; b < 32; ++b) bits |= (uint32_t)(((w * 32 + b) * 7 + r) % 3 == 0) << b;
                lists.push_back((int)bits);
            }
        }
    }
}

struct Launch {
    float* logits;
    float* scratch;
    int* top_n;
    int* params;
    int* lists;
    int* out;
    int rows;
};

static Launch prepare(const std::vector<float>& logits, const std::vector<int>& top_n,
                      const std::vector<int>& params, const std::vector<int>& lists, int rows) {
    Launch l;
    l.logits = upload(logits);
    CHECK(cudaMalloc(&l.scratch, logits.size() * sizeof(float)));
    l.top_n = upload(top_n);
    l.params = upload(params);
    l.lists = upload(lists);
    CHECK(cudaMalloc(&l.out, (size_t)rows * SAMPLE_STRIDE * sizeof(int)));
    l.rows = rows;
    return l;
}

static void release(Launch& l) {
    cudaFree(l.logits);
    cudaFree(l.scratch);
    cudaFree(l.top_n);
    cudaFree(l.params);
    cudaFree(l.lists);
    cudaFree(l.out);
}

static void run(const Launch& l) {
    sample_tokens<<<l.rows, 1024>>>(l.logits, l.scratch, l.top_n, l.params, l.lists, l.out);
}

static int draws(const char* path) {
    const int rows = 4 * NUM_MODES * 3;  // every shape in every mode, three seeds each
    const std::vector<float> logits = make_logits(rows, 42, false);
    std::vector<int> top_n(rows), params, lists;
    for (int r = 0; r < rows; ++r) top_n[r] = (r / 3) % 3 == 0 ? 5 : 0;
    auto mode_of = [](int r) { return (r / 4) % NUM_MODES; };
    pack(rows, mode_of, params, lists);
    Launch l = prepare(logits, top_n, params, lists, rows);
    run(l);
    const std::vector<int> out = finish_and_download(l.out, (size_t)rows * SAMPLE_STRIDE);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(out.data(), sizeof(int), out.size(), f) != out.size()) {
        fprintf(stderr, "cannot write %s\n", path);
        return 2;
    }
    fclose(f);
    uint64_t hash = 1469598103934665603ull;
    for (int w : out) hash = (hash ^ (uint32_t)w) * 1099511628211ull;
    int distinct = 0;
    std::vector<bool> seen(VOCAB, false);
    for (int r = 0; r < rows; ++r) {
        const int token = out[(size_t)r * SAMPLE_STRIDE];
        if (token < 0 || token >= VOCAB) {
            fprintf(stderr, "row %d: token %d out of range\n", r, token);
            return 1;
        }
        distinct += !seen[token];
        seen[token] = true;
    }
    printf("RESULT sampling draws: %d rows, %d distinct tokens, output hash %016llx\n", rows, distinct,
           (unsigned long long)hash);
    release(l);
    return 0;
}

static int bench() {
    const int sizes[] = {1, 8, 64, 256};
    const int modes[] = {0, 1, 5};
    for (int rows : sizes) {
        const std::vector<float> logits = make_logits(rows, 7, true);
        const std::vector<int> top_n(rows, 0);
        for (int mode : modes) {
            std::vector<int> params, lists;
            pack(rows, [mode](int) { return mode; }, params, lists);
            Launch l = prepare(logits, top_n, params, lists, rows);
            for (int i = 0; i < 3; ++i) run(l);
            const int iters = 20;
            StreamTimer timer;
            for (int i = 0; i < iters; ++i) run(l);
            const double us = timer.seconds() / iters * 1e6;
            CHECK(cudaGetLastError());
            printf("RESULT sampling bench rows=%d mode=\"%s\": %.1f us per launch\n", rows, MODES[mode].name, us);
            release(l);
        }
    }
    return 0;
}

int main(int argc, char** argv) {
    const std::string what = argc > 1 ? argv[1] : "";
    if (what == "draws" && argc > 2) return draws(argv[2]);
    if (what == "bench") return bench();
    fprintf(stderr, "usage: sampling-check draws FILE | bench\n");
    return 2;
}
