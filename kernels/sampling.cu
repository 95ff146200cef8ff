// Sampling and log-probabilities on the GPU, with the semantics of the engine's reference sampler
// (src/engine/sampling.rs), step for step.
//
// One block (1024 threads) per sampled row of logits [S, VOCAB] fp32. Per row:
//   1. logprobs over the raw logits: lse = logsumexp, the chosen token's logit - lse, and top_n[s]
//      alternatives in the order (logprob descending, id ascending). As in the reference, they
//      see neither the grammar mask nor the biases nor the penalties: a constrained or biased
//      row reports the model's own log-probability of the token it was made to take;
//   2. into the row's scratch copy, when the row has any of them: the grammar mask (a row with
//      one sets every token whose bit is clear to -inf: bit t % 32 of word t / 32), then
//      logit_bias (add each (token, bias) pair; the host packs them sorted without duplicates),
//      then the penalties: repetition (divide positive, multiply negative logits of every token
//      in the row's penalty list), then frequency and presence (subtract frequency * count +
//      presence for tokens generated count > 0 times). The host packs that list as distinct
//      (token, output count) pairs, so no two threads touch one token. A masked -inf stays -inf
//      through biases and penalties;
//   3. temperature <= 0: the argmax of the penalised logits (the lower id wins ties);
//   4. otherwise probabilities p = exp((l - max) / T) into the scratch row (read from the row
//      itself when step 2 had nothing to change), ranked by (p descending, id ascending): keep
//      the top_k, then the shortest prefix whose mass reaches top_p times the total, then those
//      with p >= min_p (the top p is exactly 1), and pick the first kept token whose running mass
//      exceeds u * kept total, u = uniform(seed, draw_index).
// Ranked prefixes are found without sorting: a search over the bit patterns of p (non-negative
// floats order like their bits), SEARCH_PROBES bounds per pass over the row, finds the value group
// where the running total crosses the threshold, then a scan in id order finds the element within
// the group. Every sum is a block reduction in a fixed order, so a draw is deterministic and the
// sums grow monotonically with the set they cover.
// The sums are not the reference's sequential ones, so a draw can differ from the reference's only
// where a threshold falls within float rounding of a running total.
// One block reads a row (512 KB for a 128k vocabulary) from L2 in every pass, so each pass keeps
// SAMPLE_UNROLL loads in flight per thread (for_each_logit); a thread still visits its indices in
// increasing order, so the sums add the same terms in the same order as a plain strided loop.
// Everything the host needs lands in one int32 buffer (one device-to-host copy per step). Per row,
// SAMPLE_STRIDE words: [0] token id, [1] logprob (float bits), then per alternative k:
// [2 + 2k] id, [3 + 2k] logprob. Per row the host packs SAMPLE_PARAMS parameter words (below);
// the P_*_AT words are offsets into `lists`, the sampled rows' lists region of the packed step
// inputs (src/backend/cuda/inputs.rs), which holds penalty pairs, bias pairs and masks.

#define SAMPLE_STRIDE (2 + 2 * MAX_TOP_LOGPROBS)
#define P_TEMPERATURE 0
#define P_TOP_K 1
#define P_TOP_P 2
#define P_MIN_P 3
#define P_PRESENCE 4
#define P_FREQUENCY 5
#define P_REPETITION 6
#define P_SEED_LO 7
#define P_SEED_HI 8
#define P_DRAW_LO 9
#define P_DRAW_HI 10
#define P_PENALTY_AT 11
#define P_PENALTY_LEN 12
#define P_BIAS_AT 13
#define P_BIAS_LEN 14
#define P_MASK_AT 15
#define ONE_BITS 0x3f800000
#define NO_ID 0x7fffffff
#define SAMPLE_UNROLL 8
#define SEARCH_PROBES 15

// Calls visit(i, row[i]) for this thread's indices i = threadIdx.x + j * blockDim.x of a row of
// VOCAB values, in increasing order, SAMPLE_UNROLL loads ahead. `visit` may write row[i] (each
// group of loads is issued before any of its visits).
template <typename Visit>
__device__ __forceinline__ void for_each_logit(const float* row, Visit visit) {
    const int stride = blockDim.x;
    int i = threadIdx.x;
    for (; i + (SAMPLE_UNROLL - 1) * stride < VOCAB; i += SAMPLE_UNROLL * stride) {
        float v[SAMPLE_UNROLL];
#pragma unroll
        for (int u = 0; u < SAMPLE_UNROLL; ++u) v[u] = row[i + u * stride];
#pragma unroll
        for (int u = 0; u < SAMPLE_UNROLL; ++u) visit(i + u * stride, v[u]);
    }
    for (; i < VOCAB; i += stride) visit(i, row[i]);
}

// Whether (v, i) comes before (bv, bi) in the order value descending, id ascending.
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The first (value, id) pair in rank order over the row that ranks strictly after (after_v,
// after_i). Every thread receives it.
__device__ void block_argmax_after(const float* __restrict__ row, float after_v, int after_i,
                                   float* sv, int* si, float* out_v, int* out_i) {
    float bv = -INFINITY;
    int bi = NO_ID;
    for_each_logit(row, [&](int i, float v) {
        if (v == v && ranks_before(after_v, after_i, v, i) && ranks_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ranks_before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    bv = sv[0];
    bi = si[0];
    const int warps = (blockDim.x + 31) >> 5;
    for (int w = 1; w < warps; ++w) {
        if (ranks_before(sv[w], si[w], bv, bi)) {
            bv = sv[w];
            bi = si[w];
        }
    }
    __syncthreads();
    *out_v = bv;
    *out_i = bi;
}

// The reference's counter-based uniform draw in [0, 1): two SplitMix64 finalisation rounds over
// the seed and the draw index, 24 random bits.
__device__ float uniform_draw(unsigned long long seed, unsigned long long index) {
    unsigned long long z = seed ^ ((index + 1ull) * 0x9E3779B97F4A7C15ull);
    for (int r = 0; r < 2; ++r) {
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
    }
    return (float)(z >> 40) / 16777216.0f;
}

// A ranked prefix: the elements at or before (bits, id) in the order p descending, id ascending.
struct Cut {
    int bits;
    int id;
};

__device__ __forceinline__ bool within(int bits, int id, Cut c) {
    return bits > c.bits || (bits == c.bits && id <= c.id);
}

// The shorter of two ranked prefixes.
__device__ __forceinline__ Cut shorter(Cut a, Cut b) {
    return (a.bits > b.bits || (a.bits == b.bits && a.id < b.id)) ? a : b;
}

// Minimum over a block; every thread receives it.
__device__ int block_min_int(int v, int* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int m = scratch[0];
    for (int w = 1; w < warps; ++w) m = min(m, scratch[w]);
    __syncthreads();
    return m;
}

// Sum of the kept probabilities (or their count) whose bit patterns are at least `from`.
__device__ float kept_mass(const float* __restrict__ p, Cut keep, bool count, int from, float* red) {
    float acc = 0.0f;
    for_each_logit(p, [&](int i, float v) {
        const int b = __float_as_int(v);
        if (b >= from && within(b, i, keep)) acc += count ? 1.0f : v;
    });
    return block_sum(acc, red);
}

// kept_mass for SEARCH_PROBES lower bounds at once, in one pass: mass[j] equals
// kept_mass(p, keep, count, from[j], ...) bit for bit (each thread adds the same terms in the same
// order, and the block adds the warps' sums as block_sum does). `red` holds 32 * SEARCH_PROBES
// floats of shared memory.
__device__ void kept_masses(const float* __restrict__ p, Cut keep, bool count, const int* from, float* mass,
                            float* red) {
    float acc[SEARCH_PROBES];
#pragma unroll
    for (int j = 0; j < SEARCH_PROBES; ++j) acc[j] = 0.0f;
    // `from` rises with j, so an element below from[0] adds to no sum and one at or above
    // from[SEARCH_PROBES - 1] to every sum: most elements take one of those two paths.
    for_each_logit(p, [&](int i, float v) {
        const int b = __float_as_int(v);
        if (b < from[0] || !within(b, i, keep)) return;
        const float add = count ? 1.0f : v;
        if (b >= from[SEARCH_PROBES - 1]) {
#pragma unroll
            for (int j = 0; j < SEARCH_PROBES; ++j) acc[j] += add;
        } else {
#pragma unroll
            for (int j = 0; j < SEARCH_PROBES; ++j) {
                if (b >= from[j]) acc[j] += add;
            }
        }
    });
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int j = 0; j < SEARCH_PROBES; ++j) {
        const float v = warp_sum(acc[j]);
        if (lane == 0) red[j * 32 + warp] = v;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < SEARCH_PROBES; ++j) {
        float total = 0.0f;
        for (int w = 0; w < warps; ++w) total += red[j * 32 + w];
        mass[j] = total;
    }
    __syncthreads();
}

// The id of the n-th (1-based, clamped to the group's size) kept element, in id order, whose bit
// pattern is `bits`; callers pass a group that holds at least one kept element. Warp w scans its
// own contiguous range of ids 32 at a time (one coalesced load per lane, SAMPLE_UNROLL steps in
// flight) and counts with ballots. `counts` holds 33 ints of shared memory.
__device__ int nth_in_group(const float* __restrict__ p, Cut keep, int bits, int n, int* counts) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    const int span = (VOCAB + warps * 32 - 1) / (warps * 32) * 32;
    const int begin = min(warp * span, VOCAB);
    const int end = min(begin + span, VOCAB);
    auto member = [&](int i) {
        if (i >= end) return false;
        const int b = __float_as_int(p[i]);
        return b == bits && within(b, i, keep);
    };
    int mine = 0;
    for (int base = begin; base < end; base += 32 * SAMPLE_UNROLL) {
        bool hit[SAMPLE_UNROLL];
#pragma unroll
        for (int u = 0; u < SAMPLE_UNROLL; ++u) hit[u] = member(base + 32 * u + lane);
#pragma unroll
        for (int u = 0; u < SAMPLE_UNROLL; ++u) mine += __popc(__ballot_sync(0xffffffffu, hit[u]));
    }
    if (lane == 0) counts[warp] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int w = 0; w < warps; ++w) {
            const int c = counts[w];
            counts[w] = run;
            run += c;
        }
        counts[32] = max(1, min(n, run));
    }
    __syncthreads();
    const int target = counts[32];
    const int before = counts[warp];
    __syncthreads();
    // The one warp whose range holds the target walks it again (`before` and `mine` are the same
    // in every lane, so the warp takes this branch whole).
    if (before < target && target <= before + mine) {
        int seen = before;
        for (int base = begin; base < end; base += 32) {
            const unsigned int hits = __ballot_sync(0xffffffffu, member(base + lane));
            const int c = __popc(hits);
            if (seen + c >= target) {
                const unsigned int below = hits & ((1u << lane) - 1u);
                if ((hits >> lane) & 1u && __popc(below) == target - seen - 1) counts[32] = base + lane;
                break;
            }
            seen += c;
        }
    }
    __syncthreads();
    const int id = counts[32];
    __syncthreads();
    return id;
}

__device__ __forceinline__ bool meets(float total, float threshold, bool inclusive) {
    return inclusive ? total >= threshold : total > threshold;
}

// The first kept element, in rank order, at which the running total of the probabilities (of
// ones when `count`) exceeds `threshold` (reaches it when `inclusive`). False when none does.
// `whole` is kept_mass(p, keep, count, 0, ...) when the caller has it, else negative.
// `red` holds 32 * SEARCH_PROBES floats and `counts` 33 ints of shared memory. Out of line: inlined
// at its three calls it took the kernel past its 64 registers (spills).
__device__ __noinline__ bool find_cut(const float* __restrict__ p, Cut keep, bool count, float threshold,
                         bool inclusive, float whole, float* red, int* counts, Cut* out) {
    if (whole < 0.0f) whole = kept_mass(p, keep, count, 0, red);
    if (!meets(whole, threshold, inclusive)) return false;
    // The largest bit pattern `lo` whose kept mass from `lo` up meets the threshold: the mass from
    // 0 does and the mass above ONE_BITS (every p is at most 1) is 0, which does not. The mass
    // only falls as `lo` rises, so each pass may cut [lo, hi) at SEARCH_PROBES points and keep the
    // part where the test changes: 30 bits in 8 passes, the bisection's answer.
    int lo = 0;
    int hi = ONE_BITS + 1;
    float hi_mass = 0.0f;  // the kept mass from `hi` up
    while (hi - lo > 1) {
        int from[SEARCH_PROBES];
        float mass[SEARCH_PROBES];
        const long long span = hi - lo;
#pragma unroll
        for (int j = 0; j < SEARCH_PROBES; ++j) from[j] = lo + (int)(span * (j + 1) / (SEARCH_PROBES + 1));
        kept_masses(p, keep, count, from, mass, red);
        int next_lo = lo;
        int next_hi = hi;
#pragma unroll
        for (int j = 0; j < SEARCH_PROBES; ++j) {
            if (!meets(mass[j], threshold, inclusive)) {
                next_hi = from[j];
                hi_mass = mass[j];
                break;
            }
            next_lo = from[j];
        }
        lo = next_lo;
        hi = next_hi;
    }
    // Every element of the group `lo` adds the same amount; the n-th is the first that meets
    // the threshold. `hi` is now lo + 1.
    const float above = hi_mass;
    const float step = count ? 1.0f : __int_as_float(lo);
    const float need = fminf((threshold - above) / step, (float)VOCAB);
    int n = inclusive ? (int)ceilf(need) : (int)floorf(need) + 1;
    out->bits = lo;
    out->id = nth_in_group(p, keep, lo, max(n, 1), counts);
    return true;
}

// The last kept element in rank order.
__device__ Cut last_kept(const float* __restrict__ p, Cut keep, int* iscratch, int* counts) {
    int low = NO_ID;
    for_each_logit(p, [&](int i, float v) {
        const int b = __float_as_int(v);
        if (within(b, i, keep)) low = min(low, b);
    });
    low = block_min_int(low, iscratch);
    Cut c;
    c.bits = low;
    c.id = nth_in_group(p, keep, low, VOCAB, counts);
    return c;
}

extern "C" __global__ void __launch_bounds__(1024)
sample_tokens(const float* __restrict__ logits, float* __restrict__ scratch,
              const int* __restrict__ top_n, const int* __restrict__ params,
              const int* __restrict__ lists, int* __restrict__ out) {
    await_previous_kernels();
    __shared__ float sv[32 * SEARCH_PROBES];  // block reductions; find_cut's probes use all of it
    __shared__ int si[32];
    __shared__ int counts[33];
    const int s = blockIdx.x;
    const float* row = logits + (size_t)s * VOCAB;
    float* p = scratch + (size_t)s * VOCAB;
    const int* prm = params + (size_t)s * SAMPLE_PARAMS;
    int* dst = out + (size_t)s * SAMPLE_STRIDE;

    // 1. Logprobs over the raw logits.
    float best_v;
    int best_i;
    block_argmax_after(row, INFINITY, -1, sv, si, &best_v, &best_i);
    float sum = 0.0f;
    for_each_logit(row, [&](int, float v) {
        if (v == v) sum += expf(v - best_v);
    });
    const float lse = best_v + logf(block_sum(sum, sv));
    const int n_top = min(top_n[s], MAX_TOP_LOGPROBS);
    float prev_v = INFINITY;
    int prev_i = -1;
    for (int k = 0; k < n_top; ++k) {
        float v;
        int i;
        block_argmax_after(row, prev_v, prev_i, sv, si, &v, &i);
        if (threadIdx.x == 0) {
            dst[2 + 2 * k] = i;
            dst[3 + 2 * k] = __float_as_int(v - lse);
        }
        prev_v = v;
        prev_i = i;
    }

    const float temperature = __int_as_float(prm[P_TEMPERATURE]);
    const int penalty_len = prm[P_PENALTY_LEN];
    const int bias_len = prm[P_BIAS_LEN];
    const int mask_at = prm[P_MASK_AT];
    int token = best_i;
    const bool modified = penalty_len > 0 || bias_len > 0 || mask_at >= 0;
    // The logits step 4 reads: the row itself, or its scratch copy once step 2 has changed it.
    const float* logits_in = row;
    if (modified) {
        // 2. Mask, biases and penalties on a scratch copy.
        if (mask_at >= 0) {
            const unsigned int* mask = (const unsigned int*)(lists + mask_at);
            for_each_logit(row, [&](int i, float v) { p[i] = (mask[i >> 5] >> (i & 31)) & 1u ? v : -INFINITY; });
        } else {
            for_each_logit(row, [&](int i, float v) { p[i] = v; });
        }
        __syncthreads();
        const int* biases = lists + prm[P_BIAS_AT];
        for (int j = threadIdx.x; j < bias_len; j += blockDim.x) {
            const int tok = biases[2 * j];
            p[tok] = __fadd_rn(p[tok], __int_as_float(biases[2 * j + 1]));
        }
        __syncthreads();
        const float repetition = __int_as_float(prm[P_REPETITION]);
        const float frequency = __int_as_float(prm[P_FREQUENCY]);
        const float presence = __int_as_float(prm[P_PRESENCE]);
        const int* pairs = lists + prm[P_PENALTY_AT];
        for (int j = threadIdx.x; j < penalty_len; j += blockDim.x) {
            const int tok = pairs[2 * j];
            const int generated = pairs[2 * j + 1];
            float l = p[tok];
            if (repetition != 1.0f) {
                l = l > 0.0f ? __fdiv_rn(l, repetition) : __fmul_rn(l, repetition);
            }
            if (generated > 0) {
                l = __fsub_rn(l, __fadd_rn(__fmul_rn(frequency, (float)generated), presence));
            }
            p[tok] = l;
        }
        __syncthreads();
        logits_in = p;
        if (temperature <= 0.0f) {
            // 3. Greedy over the penalised logits.
            float v;
            block_argmax_after(p, INFINITY, -1, sv, si, &v, &token);
        }
    }
    if (temperature > 0.0f) {
        // 4. Temperature, the three filters and the draw. The largest unchanged logit is the
        // argmax's (both skip NaN).
        float m = best_v;
        if (modified) {
            m = -INFINITY;
            for_each_logit(p, [&](int, float v) { m = fmaxf(m, v); });
            m = warp_max(m);
            if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = m;
            __syncthreads();
            m = sv[0];
            for (int w = 1; w < (int)((blockDim.x + 31) >> 5); ++w) m = fmaxf(m, sv[w]);
            __syncthreads();
        }
        const float inv_t = __fdiv_rn(1.0f, temperature);
        // The probabilities into the scratch row, and their sum: kept_mass over every element,
        // the same terms in the same order, so the same float.
        float sum_p = 0.0f;
        for_each_logit(logits_in, [&](int i, float v) {
            const float e = expf(__fmul_rn(__fsub_rn(v, m), inv_t));
            p[i] = e;
            sum_p += e;
        });
        const float all_total = block_sum(sum_p, sv);
        Cut keep;
        keep.bits = 0;
        keep.id = NO_ID;
        bool narrowed = false;
        Cut cut;
        const int top_k = prm[P_TOP_K];
        if (top_k > 0 && top_k < VOCAB &&
            find_cut(p, keep, true, (float)(top_k - 1), false, -1.0f, sv, counts, &cut)) {
            keep = cut;
            narrowed = true;
        }
        const float top_p = __int_as_float(prm[P_TOP_P]);
        if (top_p < 1.0f && find_cut(p, keep, false, __fmul_rn(top_p, all_total), true,
                                     narrowed ? -1.0f : all_total, sv, counts, &cut)) {
            keep = shorter(keep, cut);
            narrowed = true;
        }
        const float min_p = __int_as_float(prm[P_MIN_P]);
        if (min_p > 0.0f) {
            // The top probability is exactly 1; the top token always stays.
            const Cut floor_cut = {__float_as_int(fminf(min_p, 1.0f)), NO_ID};
            keep = shorter(keep, floor_cut);
            narrowed = true;
        }
        const float kept_total = narrowed ? kept_mass(p, keep, false, 0, sv) : all_total;
        const unsigned long long seed =
            ((unsigned long long)(unsigned int)prm[P_SEED_HI] << 32) |
            (unsigned int)prm[P_SEED_LO];
        const unsigned long long draw =
            ((unsigned long long)(unsigned int)prm[P_DRAW_HI] << 32) |
            (unsigned int)prm[P_DRAW_LO];
        const float threshold = __fmul_rn(uniform_draw(seed, draw), kept_total);
        if (find_cut(p, keep, false, threshold, false, kept_total, sv, counts, &cut)) {
            token = cut.id;
        } else {
            token = last_kept(p, keep, si, counts).id;
        }
    }
    if (threadIdx.x == 0) {
        dst[0] = token;
        dst[1] = __float_as_int(row[token] - lse);
    }
}
