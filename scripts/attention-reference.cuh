// The float64 attention reference shared by scripts/attention-check.cu and prefill-check.cu:
// causal (and sliding-window) attention of every token over its row's paged cache, from the same
// bf16 inputs the kernels read, with per-head attention sinks when given (a logit per query head
// that joins the softmax's denominator, as gpt-oss's `self_attn.sinks`). Needs the model's shape macros (NUM_Q_HEADS, NUM_KV_HEADS,
// HEAD_DIM, KV_BLOCK, SLIDING_WINDOW) and check-common.cuh.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

// Output [tokens, NUM_Q_HEADS, HEAD_DIM] of token t attending to positions up to positions[t] of
// row rows[t] (block table row rows[t] of `tables`, `max_blocks` entries per row); a token with
// rows[t] < 0 is padding and stays zero. The cache holds slots of NUM_KV_HEADS * HEAD_DIM
// elements, whose values key(k[i]) and value(v[i]) give (the FP8 cache's harnesses pass the
// scaled E4M3 values: scripts/kv-check.cuh). `sinks`, when not null, holds NUM_Q_HEADS logits.
template <typename KV, typename Key, typename Value>
static std::vector<double> attention_reference(const std::vector<uint16_t>& q, const std::vector<KV>& k,
                                               const std::vector<KV>& v, const std::vector<int>& tables,
                                               int max_blocks, const std::vector<int>& rows,
                                               const std::vector<int>& positions, float scale, Key key,
                                               Value value, const float* sinks = nullptr) {
    const int tokens = (int)rows.size();
    const size_t slot_elems = (size_t)NUM_KV_HEADS * HEAD_DIM;
    const int group = NUM_Q_HEADS / NUM_KV_HEADS;
    std::vector<double> ref((size_t)tokens * NUM_Q_HEADS * HEAD_DIM, 0.0);
    for (int t = 0; t < tokens; ++t) {
        const int row = rows[t];
        const int pos = positions[t];
        if (row < 0) continue;
        const int lo = SLIDING_WINDOW > 0 ? std::max(0, pos + 1 - SLIDING_WINDOW) : 0;
        auto slot_of = [&](int j) {
            return (size_t)tables[(size_t)row * max_blocks + j / KV_BLOCK] * KV_BLOCK + j % KV_BLOCK;
        };
        for (int h = 0; h < NUM_Q_HEADS; ++h) {
            const int kvh = h / group;
            std::vector<double> s;
            double top = -1e300;
            for (int j = lo; j <= pos; ++j) {
                const size_t slot = slot_of(j);
                double dot = 0.0;
                for (int d = 0; d < HEAD_DIM; ++d) {
                    dot += (double)from_bf16(q[((size_t)t * NUM_Q_HEADS + h) * HEAD_DIM + d]) *
                           key(k[slot * slot_elems + kvh * HEAD_DIM + d]);
                }
                s.push_back(dot * scale);
                top = std::max(top, dot * scale);
            }
            double total = 0.0;
            for (auto& x : s) total += (x = std::exp(x - top));
            if (sinks) total += std::exp((double)sinks[h] - top);
            for (int j = lo; j <= pos; ++j) {
                const size_t slot = slot_of(j);
                for (int d = 0; d < HEAD_DIM; ++d) {
                    ref[((size_t)t * NUM_Q_HEADS + h) * HEAD_DIM + d] +=
                        s[j - lo] / total * value(v[slot * slot_elems + kvh * HEAD_DIM + d]);
                }
            }
        }
    }
    return ref;
}

// The same over a bf16 cache.
static std::vector<double> attention_reference(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                                               const std::vector<uint16_t>& v, const std::vector<int>& tables,
                                               int max_blocks, const std::vector<int>& rows,
                                               const std::vector<int>& positions, float scale) {
    auto widen = [](uint16_t b) { return (double)from_bf16(b); };
    return attention_reference(q, k, v, tables, max_blocks, rows, positions, scale, widen, widen);
}

// The per-head attention sinks of a build with sinks (host copy and device copy; null without),
// drawn by make_sinks(rng, ATTN_SINKS): logits in [-4, 4], head 0's dominant (9: most of every
// softmax's mass, the output shrinks) and head 1's negligible (-30).
static std::vector<float> host_sinks;
static float* device_sinks = nullptr;
static void make_sinks(std::mt19937_64& rng, bool with_sinks) {
    if (!with_sinks) return;
    std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
    host_sinks.resize(NUM_Q_HEADS);
    for (auto& x : host_sinks) x = uni(rng);
    host_sinks[0] = 9.0f;
    if (NUM_Q_HEADS > 1) host_sinks[1] = -30.0f;
    if (device_sinks) CHECK(cudaFree(device_sinks));
    device_sinks = upload(host_sinks);
}
