// Paged attention for grouped-query heads (flash-decoding), used for decode and for prefill when
// the tiled prefill kernel cannot take the group.
//
// Every step token t attends causally to positions [0, positions[t]] of its sequence (or the last
// SLIDING_WINDOW of them), reading keys and values from the paged cache through its row's block
// table. The QKV kernel has already written this step's keys and values, so a prefill chunk sees
// both earlier chunks and cached prefix blocks, and a decode token sees its whole context.
//
// paged_attention: grid (T, NUM_KV_HEADS, splits), ATTN_WARPS warps per block (ATTN_WARPS,
// ATTN_DEPTH and ATTN_MIN_PARTITION come from the host, src/backend/cuda/plan.rs). A block serves
// all GROUP query heads of one KV head, so each key and value row is read once for the whole
// group.
// Split-K over long contexts: the host fixes `splits`, the most partitions per token (grid z,
// and the stride of the partial buffers), so a launch can be captured once in a CUDA graph and
// replayed for any context. Each token derives its own partition from the n positions it attends
// to: token_splits(n) = min(splits, ceil(n / ATTN_MIN_PARTITION)) partitions of
// ceil(n / token_splits) positions rounded up to whole KV blocks; blocks with z beyond that
// return at once and the reduction never reads their slots.
//
// Inside a block, each warp walks its share of the partition's keys and keeps an online softmax
// per query head: on tensor cores (warp_attend_mma: 16 keys per step, the group's heads as the
// rows of two mma products) where the shape allows, else on CUDA cores (warp_attend_lanes:
// 16-byte loads spread over lanes, several keys in flight). The warps then merge in shared
// memory, and the block writes an unnormalised partial result (acc, max, sum) per head and split,
// or, when the token has a single partition, its normalised output straight to `out` (bf16
// [T, NUM_Q_HEADS * HEAD_DIM]), the same values attention_reduce would write: a launch whose
// `splits` is 1 (large batches) then needs no reduction launch at all.
// A launch of at most ATTN_MERGE_SPLITS splits (from the host) merges them itself: the last of a
// token's blocks to finish (a count per token and KV head in `merge_counts`, zero between
// launches: that block resets it) reads the others' partials and writes the output, so no
// reduction launch follows; a launch of more splits leaves them to attention_reduce.
// The block-table stride (max_blocks) is read from device memory, so a captured launch serves
// any table length.
// attention_reduce: grid (T, NUM_Q_HEADS), ATTN_REDUCE_THREADS threads, merges the token's splits
// (rows of threads walk the splits in parallel, 16-byte loads) and writes bf16
// [T, NUM_Q_HEADS * HEAD_DIM]; a token with one partition was written by paged_attention and is
// left alone. token_row[t] < 0 marks a padding token (its output is zero).
// With ATTN_SINKS (prelude.cuh) each query head's sink joins the sum wherever an output is
// normalised (paged_attention's single partition and its merge, attention_reduce), so the
// partials stay those of the keys alone and the decode loop is the same as without sinks.
// With `all_splits` set it merges all `splits` partials of every token instead of the token's own
// count: prefill_attention (kernels/prefill_attention.cu) splits a tile's keys evenly and writes
// every split.
// HEAD_DIM must be a multiple of 8 and at most 256 (the host refuses other shapes).
//
// An FP8 cache (KV_FP8, prelude.cuh): keys and values are E4M3 bytes, half the bytes of a bf16
// row, loaded as they are (8 bytes where bf16 takes 16, the same dimensions per lane) and widened
// in registers only where they are used: to f16 for the tensor-core path, whose products then
// take f16 inputs (the queries and P rounded to f16: E4M3 values are exact in f16), to float on
// the CUDA cores. The layer's k scale multiplies the softmax scale and its v scale the warp's
// accumulators before they merge, so no element is scaled on its own.

// The full-attention variant (family attention_full.cu, this source after `#define
// ATTN_FULL_VARIANT`): a model whose layers alternate sliding and full attention (gpt-oss) gets
// SLIDING_WINDOW for its sliding layers from the host, and this build without a window, its entry
// points suffixed _full, for the others.
#ifdef ATTN_FULL_VARIANT
#undef SLIDING_WINDOW
#define SLIDING_WINDOW 0
#define paged_attention paged_attention_full
#define attention_reduce attention_reduce_full
#endif

// An FP8 cache's tiles in flight per warp (ATTN_DEPTH_FP8 from the host, where given).
#if KV_FP8 && defined(ATTN_DEPTH_FP8)
#undef ATTN_DEPTH
#define ATTN_DEPTH ATTN_DEPTH_FP8
#endif
#define GROUP (NUM_Q_HEADS / NUM_KV_HEADS)
#define ATTN_VEC 8
#define CHUNKS (HEAD_DIM / ATTN_VEC)
#define KEY_LANES (CHUNKS <= 1 ? 1 : CHUNKS <= 2 ? 2 : CHUNKS <= 4 ? 4 : CHUNKS <= 8 ? 8 : CHUNKS <= 16 ? 16 : 32)
#define KEYS_PER_PASS (32 / KEY_LANES)
#define ATTN_UNROLL (GROUP > 4 ? 2 : 4)
// Groups above 4 keep the query slices in shared memory instead of registers (registers would
// hold 8 slices and 8 accumulators per head and halve the blocks per SM).
#define ATTN_Q_SHARED (GROUP > 4)
#define KEYS_PER_WARP (KEYS_PER_PASS * ATTN_UNROLL)
#define LOG2E 1.4426950408889634f
// The tensor-core path (warp_attend_mma) serves head_dim multiples of 32 up to 128 and groups up
// to 8 on sm_80 and newer; other shapes take the CUDA-core path (warp_attend_lanes).
#if HEAD_DIM % 32 == 0 && HEAD_DIM <= 128 && GROUP <= 8 && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define ATTN_MMA 1
#else
#define ATTN_MMA 0
#endif
#define ATTN_TILE 16                  // keys per warp and step of the tensor-core path
#define ATTN_K_STEPS (HEAD_DIM / 16)  // k-steps of S = Q K^T
#define ATTN_K_CHUNKS (HEAD_DIM / 32) // 16-byte loads per lane and key of K
#define ATTN_V_DIMS (HEAD_DIM / 8)    // 8-dimension column blocks of O; values per lane and key of V
#define ATTN_V_VEC (ATTN_V_DIMS % 8 == 0 ? 8 : 4)  // values per load of V
#define ATTN_V_LOADS (ATTN_V_DIMS / ATTN_V_VEC)
// attention_reduce: ATTN_REDUCE_THREADS threads (from the host) as REDUCE_ROWS rows of
// REDUCE_LANES threads, each thread 4 dimensions of one split at a time.
#define REDUCE_LANES (HEAD_DIM / 4)
#define REDUCE_ROWS (ATTN_REDUCE_THREADS / REDUCE_LANES)
// 32-bit words a lane holds per key of the tensor-core path: of one key chunk (8 values), and of
// all its value loads.
#if KV_FP8
#define ATTN_KW 2
#define ATTN_VW (ATTN_V_DIMS / 4)
#else
#define ATTN_KW 4
#define ATTN_VW (ATTN_V_DIMS / 2)
#endif

// Positions a token at `pos` attends to.
__device__ __forceinline__ int attended(int pos) {
#if SLIDING_WINDOW > 0
    return min(pos + 1, SLIDING_WINDOW);
#else
    return pos + 1;
#endif
}

// Partitions of a token attending to `n` positions when the launch allows at most `splits`.
__device__ __forceinline__ int token_splits(int n, int splits) {
    return min(splits, max(1, (n + ATTN_MIN_PARTITION - 1) / ATTN_MIN_PARTITION));
}

// Widens 8 bf16 values packed in a 16-byte word.
__device__ __forceinline__ void unpack8(uint4 w, float* out) {
    const unsigned int u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

#if KV_FP8
// Eight keys' or values' E4M3 bytes (8 consecutive dimensions of one row).
typedef uint2 kv_word;

// Widens 8 E4M3 bytes to floats (exact).
__device__ __forceinline__ void unpack_kv8(uint2 w, float* out) {
    const unsigned int u[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int h = f16x2_from_e4m3x2(u[i / 2] >> (16 * (i & 1)));
        out[2 * i] = f16_to_f32((unsigned short)(h & 0xffffu));
        out[2 * i + 1] = f16_to_f32((unsigned short)(h >> 16));
    }
}

// The tensor-core product of attention.cu's FP8 path: mma_bf16_upper (prelude.cuh) with f16
// inputs.
__device__ __forceinline__ void mma_f16_upper(float* c, unsigned int a_lo, unsigned int a_hi, unsigned int b0,
                                              unsigned int b1) {
    float discarded0, discarded1;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %5}, "
        "{%7, %8}, {%0, %1, %9, %9};"
        : "+f"(c[0]), "+f"(c[1]), "=f"(discarded0), "=f"(discarded1)
        : "r"(a_lo), "r"(0u), "r"(a_hi), "r"(b0), "r"(b1), "f"(0.0f));
}

// Two floats rounded to f16 and packed, `lo` in the low half.
__device__ __forceinline__ unsigned int pack_f16x2(float lo, float hi) {
    unsigned int packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}
#else
// Eight keys' or values' bf16 values (8 consecutive dimensions of one row).
typedef uint4 kv_word;

// Widens 8 bf16 values (exact).
__device__ __forceinline__ void unpack_kv8(uint4 w, float* out) { unpack8(w, out); }
#endif

// The layer's softmax scale for raw scores of cached keys (times the k scale of an FP8 cache).
__device__ __forceinline__ float key_scale(float scale, const float* __restrict__ kv_scales) {
#if KV_FP8
    return scale * kv_scales[0];
#else
    return scale;
#endif
}

// The factor of the accumulated values (the v scale of an FP8 cache).
__device__ __forceinline__ float value_scale(const float* __restrict__ kv_scales) {
#if KV_FP8
    return kv_scales[1];
#else
    return 1.0f;
#endif
}

// The cache slot of position `key` of a sequence with block table `table`.
__device__ __forceinline__ size_t cache_slot(const int* __restrict__ table, int key) {
    return (size_t)table[key / KV_BLOCK] * KV_BLOCK + key % KV_BLOCK;
}

#if ATTN_MMA
// The head dimension that column `col` (0-7) of O's column block `n` holds on the tensor-core
// path: value loads of lane group g read ATTN_V_VEC dimensions at ATTN_V_VEC * (8 * load + g).
__device__ __forceinline__ int value_dim(int n, int col) {
    return ATTN_V_VEC * (8 * (n / ATTN_V_VEC) + col) + n % ATTN_V_VEC;
}

// Words of one value load (ATTN_V_VEC values) at `p`.
__device__ __forceinline__ void load_value_words(const kv_t* p, unsigned int* w) {
#if KV_FP8 && ATTN_V_VEC == 8
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = x.x;
    w[1] = x.y;
#elif KV_FP8
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
#elif ATTN_V_VEC == 8
    const uint4 x = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = x.x;
    w[1] = x.y;
    w[2] = x.z;
    w[3] = x.w;
#else
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = x.x;
    w[1] = x.y;
#endif
}

// Lane (g, t)'s key words of the 16-key tile at `base` (see warp_attend_mma): keys base + g and
// base + 8 + g, 16-byte chunks 4c + t of each; zeros for keys at or after `end`.
__device__ __forceinline__ void load_key_tile(const kv_t* __restrict__ k_cache, const int* __restrict__ table,
                                              size_t head_offset, int base, int end, int g, int t,
                                              unsigned int (&kw)[2][ATTN_K_CHUNKS][ATTN_KW]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int key = base + 8 * j + g;
        const bool valid = key < end;
        const kv_t* row = k_cache + (valid ? cache_slot(table, key) : 0) * NUM_KV_HEADS * HEAD_DIM + head_offset;
#pragma unroll
        for (int c = 0; c < ATTN_K_CHUNKS; ++c) {
#if KV_FP8
            uint2 w = make_uint2(0, 0);
            if (valid) w = __ldg(reinterpret_cast<const uint2*>(row + 8 * (4 * c + t)));
            kw[j][c][0] = w.x;
            kw[j][c][1] = w.y;
#else
            uint4 w = make_uint4(0, 0, 0, 0);
            if (valid) w = __ldg(reinterpret_cast<const uint4*>(row + 8 * (4 * c + t)));
            kw[j][c][0] = w.x;
            kw[j][c][1] = w.y;
            kw[j][c][2] = w.z;
            kw[j][c][3] = w.w;
#endif
        }
    }
}

// Lane (g, t)'s value words of the 16-key tile at `base`: keys base + 2t, 2t+1, 2t+8 and 2t+9,
// value slice g of each ATTN_V_VEC * 8 dimensions; zeros for keys at or after `end`.
__device__ __forceinline__ void load_value_tile(const kv_t* __restrict__ v_cache, const int* __restrict__ table,
                                                size_t head_offset, int base, int end, int g, int t,
                                                unsigned int (&vw)[4][ATTN_VW]) {
    constexpr int words = ATTN_VW / ATTN_V_LOADS;  // per load
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int key = base + 2 * t + (r & 1) + 8 * (r >> 1);
        const bool valid = key < end;
        const kv_t* row = v_cache + (valid ? cache_slot(table, key) : 0) * NUM_KV_HEADS * HEAD_DIM + head_offset;
#pragma unroll
        for (int i = 0; i < ATTN_V_LOADS; ++i) {
            if (valid) {
                load_value_words(row + ATTN_V_VEC * (8 * i + g), &vw[r][i * words]);
            } else {
#pragma unroll
                for (int w = 0; w < words; ++w) vw[r][i * words + w] = 0;
            }
        }
    }
}

// One 16-key tile of warp_attend_mma's loop at `base`: S = Q K^T from the tile's key words kw,
// which are then reloaded with tile `next` (when it starts before `end`), the online softmax,
// O += P V from the value words vw, which are then reloaded with tile `next` likewise. So each
// stage of registers is refilled as soon as its words are used.
__device__ __forceinline__ void attend_tile(const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                                            const int* __restrict__ table, size_t head_offset, int base,
                                            int next, int end, int g, int t, float log2_scale,
                                            const unsigned int (&qa)[ATTN_K_STEPS][2],
                                            unsigned int (&kw)[2][ATTN_K_CHUNKS][ATTN_KW],
                                            unsigned int (&vw)[4][ATTN_VW], float (&o)[ATTN_V_DIMS][2],
                                            float& m, float& l) {
    // S: s[j][e] is the score of head g for key base + 8j + 2t + e.
    float s[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        s[j][0] = s[j][1] = 0.0f;
#pragma unroll
        for (int k = 0; k < ATTN_K_STEPS; ++k) {
#if KV_FP8
            // Word k & 1 of chunk k / 2 holds the 4 dimensions bf16 words 2(k & 1) and 2(k & 1) + 1
            // would.
            const unsigned int word = kw[j][k / 2][k & 1];
            mma_f16_upper(s[j], qa[k][0], qa[k][1], f16x2_from_e4m3x2(word), f16x2_from_e4m3x2(word >> 16));
#else
            mma_bf16_upper(s[j], qa[k][0], qa[k][1], kw[j][k / 2][2 * (k & 1)], kw[j][k / 2][2 * (k & 1) + 1]);
#endif
        }
    }
    const bool more = next < end;
    if (more) load_key_tile(k_cache, table, head_offset, next, end, g, t, kw);
    if (base + ATTN_TILE > end) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (base + 8 * j + 2 * t + e >= end) s[j][e] = -INFINITY;
            }
        }
    }
    // A tile holds at least one valid key, so the maximum is finite.
    float top = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
    if (__any_sync(0xffffffffu, top > m)) {
        const float raised = fmaxf(m, top);
        const float alpha = exp2f((m - raised) * log2_scale);  // 0 while m is -inf
        l *= alpha;
#pragma unroll
        for (int n = 0; n < ATTN_V_DIMS; ++n) {
            o[n][0] *= alpha;
            o[n][1] *= alpha;
        }
        m = raised;
    }
    const float shift = -m * log2_scale;
    float p[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            p[j][e] = exp2f(fmaf(s[j][e], log2_scale, shift));
            l += p[j][e];
        }
    }
#if KV_FP8
    const unsigned int pa_lo = pack_f16x2(p[0][0], p[0][1]);
    const unsigned int pa_hi = pack_f16x2(p[1][0], p[1][1]);

    // O += P V, one 8-dimension column block per step: byte n % 4 of two keys' words, widened.
#pragma unroll
    for (int n = 0; n < ATTN_V_DIMS; ++n) {
        const int word = (n / ATTN_V_VEC) * (ATTN_V_VEC / 4) + (n % ATTN_V_VEC) / 4;
        const unsigned int select = (n & 3) | ((4 + (n & 3)) << 4);
        const unsigned int b0 = f16x2_from_e4m3x2(__byte_perm(vw[0][word], vw[1][word], select));
        const unsigned int b1 = f16x2_from_e4m3x2(__byte_perm(vw[2][word], vw[3][word], select));
        mma_f16_upper(o[n], pa_lo, pa_hi, b0, b1);
    }
#else
    const unsigned int pa_lo = pack_bf16x2(p[0][0], p[0][1]);
    const unsigned int pa_hi = pack_bf16x2(p[1][0], p[1][1]);

    // O += P V, one 8-dimension column block per step.
#pragma unroll
    for (int n = 0; n < ATTN_V_DIMS; ++n) {
        const int word = (n / ATTN_V_VEC) * (ATTN_V_VEC / 2) + (n % ATTN_V_VEC) / 2;
        const unsigned int select = (n & 1) ? 0x7632 : 0x5410;
        const unsigned int b0 = __byte_perm(vw[0][word], vw[1][word], select);
        const unsigned int b1 = __byte_perm(vw[2][word], vw[3][word], select);
        mma_bf16_upper(o[n], pa_lo, pa_hi, b0, b1);
    }
#endif
    if (more) load_value_tile(v_cache, table, head_offset, next, end, g, t, vw);
}

// One warp's share of keys [begin, end) on tensor cores, ATTN_TILE keys at a time; writes the
// warp's unnormalised result (max in the log2 domain, sum, acc) per query head of the group.
//
// Thread (g = lane / 4, t = lane % 4). S = Q K^T per 16-key tile as two m16n8k16 products whose
// rows are the group's query heads (rows from GROUP on, and 8-15, are zero) and whose columns
// are keys: g names the key of a K load (keys g and 8 + g of the tile) and the head of a row.
// Head dimensions are permuted freely, the same way for Q and K: lane t's 16-byte loads are
// chunks 4c + t of the row (c < HEAD_DIM / 32), so a load instruction reads 64 contiguous bytes
// of a key per four lanes. The S accumulators are the A fragments of O += P V (P rounded to
// bf16), whose B fragments need two keys' values of one dimension per word: lane (g, t) loads
// keys 2t, 2t+1, 2t+8 and 2t+9 of the tile, ATTN_V_VEC values at a time from value slice g of
// each ATTN_V_VEC * 8 dimensions, and pairs them with byte permutes. The output's dimensions
// follow that order (see `value_dim`). Online softmax per head over the raw scores, the scale
// folded into each exp2's argument; the accumulators are rescaled only when a maximum moved.
// The warp keeps ATTN_DEPTH tiles' key and value words in flight (stages of registers, refilled
// by attend_tile as soon as they are used), so its first loads and every later one overlap the
// products of the tiles before them.
__device__ __forceinline__ void warp_attend_mma(const bf16* __restrict__ q_group,
                                                const kv_t* __restrict__ k_cache,
                                                const kv_t* __restrict__ v_cache,
                                                const int* __restrict__ table, int kvh, int begin, int end,
                                                int stable_end, float scale, float v_scale, float* sm_m,
                                                float* sm_l, float (*sm_acc)[HEAD_DIM]) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const float log2_scale = scale * LOG2E;
    const size_t head_offset = (size_t)kvh * HEAD_DIM;
    const int stride = ATTN_WARPS * ATTN_TILE;
    // The first tiles' keys and values below `stable_end` were written by earlier steps: they are
    // loaded before the wait for the previous kernel (which writes this step's keys and values),
    // so their latency overlaps its tail; a tile reaching past `stable_end` is loaded again after.
    unsigned int kw[ATTN_DEPTH][2][ATTN_K_CHUNKS][ATTN_KW];
    unsigned int vw[ATTN_DEPTH][4][ATTN_VW];
    const int first_base = begin + warp * ATTN_TILE;
#pragma unroll
    for (int stage = 0; stage < ATTN_DEPTH; ++stage) {
        const int base = first_base + stage * stride;
        if (base < end) {
            load_key_tile(k_cache, table, head_offset, base, min(end, stable_end), g, t, kw[stage]);
            load_value_tile(v_cache, table, head_offset, base, min(end, stable_end), g, t, vw[stage]);
        }
    }
    await_previous_kernels();
#pragma unroll
    for (int stage = 0; stage < ATTN_DEPTH; ++stage) {
        const int base = first_base + stage * stride;
        if (base < end && base + ATTN_TILE > stable_end) {
            load_key_tile(k_cache, table, head_offset, base, end, g, t, kw[stage]);
            load_value_tile(v_cache, table, head_offset, base, end, g, t, vw[stage]);
        }
    }

    // Q as A fragments: k-step 2c takes words x and y of chunk c, k-step 2c+1 words z and w.
    unsigned int qa[ATTN_K_STEPS][2];
#pragma unroll
    for (int c = 0; c < ATTN_K_CHUNKS; ++c) {
        uint4 w = make_uint4(0, 0, 0, 0);
        if (g < GROUP) w = *reinterpret_cast<const uint4*>(q_group + (size_t)g * HEAD_DIM + 8 * (4 * c + t));
#if KV_FP8
        w = make_uint4(f16x2_from_bf16x2(w.x), f16x2_from_bf16x2(w.y), f16x2_from_bf16x2(w.z),
                       f16x2_from_bf16x2(w.w));
#endif
        qa[2 * c][0] = w.x;
        qa[2 * c][1] = w.y;
        qa[2 * c + 1][0] = w.z;
        qa[2 * c + 1][1] = w.w;
    }

    float o[ATTN_V_DIMS][2];
#pragma unroll
    for (int n = 0; n < ATTN_V_DIMS; ++n) o[n][0] = o[n][1] = 0.0f;
    float m = -INFINITY;  // of the raw scores of head g
    float l = 0.0f;       // this lane's keys only; the four lanes of a head add up at the end

    // Stage s holds tile base + s * stride; once used it is refilled with the tile ATTN_DEPTH
    // strides on.
    for (int base = first_base; base < end; base += ATTN_DEPTH * stride) {
#pragma unroll
        for (int stage = 0; stage < ATTN_DEPTH; ++stage) {
            const int tile = base + stage * stride;
            if (tile >= end) break;
            attend_tile(k_cache, v_cache, table, head_offset, tile, tile + ATTN_DEPTH * stride, end, g, t,
                        log2_scale, qa, kw[stage], vw[stage], o, m, l);
        }
    }

    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (g < GROUP) {
        if (t == 0) {
            sm_m[g] = m * log2_scale;
            sm_l[g] = l;
        }
#pragma unroll
        for (int n = 0; n < ATTN_V_DIMS; ++n) {
#if KV_FP8
            o[n][0] *= v_scale;
            o[n][1] *= v_scale;
#endif
            sm_acc[g][value_dim(n, 2 * t)] = o[n][0];
            sm_acc[g][value_dim(n, 2 * t + 1)] = o[n][1];
        }
    }
}
#else
// One warp's share of keys [begin, end) on CUDA cores; writes the warp's unnormalised result (max
// in the log2 domain, sum, acc) per query head of the group. A key row is read with 16-byte loads
// by KEY_LANES lanes (8 values each), so a warp covers KEYS_PER_PASS keys at once and issues
// ATTN_UNROLL such passes before it uses any of them. Each lane keeps the query slice of every
// head of the group, scores its keys for all heads (a partial dot product reduced over its
// KEY_LANES lanes), and keeps one online softmax per head and key slot, rescaled once per pass
// group; q is pre-scaled by scale * log2(e) so every exponential is one exp2. At the end the key
// slots of the warp merge by shuffles.
__device__ __forceinline__ void warp_attend_lanes(const bf16* __restrict__ q_group,
                                                  const kv_t* __restrict__ k_cache,
                                                  const kv_t* __restrict__ v_cache,
                                                  const int* __restrict__ table, int kvh, int begin, int end,
                                                  float scale, float v_scale, float* sm_m, float* sm_l,
                                                  float (*sm_acc)[HEAD_DIM]) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int sub = lane / KEY_LANES;  // key slot of this lane within a pass
    const int chunk = lane % KEY_LANES;  // which 8 dimensions this lane holds
    const bool active = chunk < CHUNKS;

    // This lane's slice of every query head of the group, scaled into the log2 domain.
#if ATTN_Q_SHARED
    __shared__ __align__(16) float qs[GROUP][KEY_LANES * ATTN_VEC];
    for (int i = threadIdx.x; i < GROUP * KEY_LANES * ATTN_VEC; i += blockDim.x) {
        const int g = i / (KEY_LANES * ATTN_VEC);
        const int d = i % (KEY_LANES * ATTN_VEC);
        qs[g][d] = d < HEAD_DIM ? bf16_to_f32(q_group[(size_t)g * HEAD_DIM + d]) * (scale * LOG2E) : 0.0f;
    }
    __syncthreads();
#else
    float qf[GROUP][ATTN_VEC];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        if (active) {
            const uint4 w = *reinterpret_cast<const uint4*>(q_group + (size_t)g * HEAD_DIM + chunk * ATTN_VEC);
            unpack8(w, qf[g]);
        } else {
#pragma unroll
            for (int i = 0; i < ATTN_VEC; ++i) qf[g][i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < ATTN_VEC; ++i) qf[g][i] *= scale * LOG2E;
    }
#endif

    float m[GROUP];
    float l[GROUP];
    float acc[GROUP][ATTN_VEC];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < ATTN_VEC; ++i) acc[g][i] = 0.0f;
    }

    const size_t head_offset = (size_t)kvh * HEAD_DIM + chunk * ATTN_VEC;
    for (int base = begin + warp * KEYS_PER_WARP; base < end; base += ATTN_WARPS * KEYS_PER_WARP) {
        kv_word kw[ATTN_UNROLL];
        kv_word vw[ATTN_UNROLL];
        bool valid[ATTN_UNROLL];
        // Issue every load of the pass group before using any.
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int j = base + u * KEYS_PER_PASS + sub;
            valid[u] = j < end;
            kw[u] = {};
            vw[u] = {};
            if (valid[u] && active) {
                const size_t slot = cache_slot(table, j);
                const size_t offset = slot * NUM_KV_HEADS * HEAD_DIM + head_offset;
                kw[u] = __ldg(reinterpret_cast<const kv_word*>(k_cache + offset));
                vw[u] = __ldg(reinterpret_cast<const kv_word*>(v_cache + offset));
            }
        }
        float s[ATTN_UNROLL][GROUP];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            float kf[ATTN_VEC];
            unpack_kv8(kw[u], kf);
#pragma unroll
            for (int g = 0; g < GROUP; ++g) {
                float dot = 0.0f;
#if ATTN_Q_SHARED
                const float4 qa = reinterpret_cast<const float4*>(&qs[g][chunk * ATTN_VEC])[0];
                const float4 qb = reinterpret_cast<const float4*>(&qs[g][chunk * ATTN_VEC])[1];
                const float qg[ATTN_VEC] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#else
                const float* qg = qf[g];
#endif
#pragma unroll
                for (int i = 0; i < ATTN_VEC; ++i) dot = fmaf(qg[i], kf[i], dot);
#pragma unroll
                for (int o = KEY_LANES / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                s[u][g] = valid[u] ? dot : -INFINITY;
            }
        }
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            float top = m[g];
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) top = fmaxf(top, s[u][g]);
            if (top == -INFINITY) continue;  // no valid key in this slot yet
            const float alpha = exp2f(m[g] - top);
            m[g] = top;
            l[g] *= alpha;
#pragma unroll
            for (int i = 0; i < ATTN_VEC; ++i) acc[g][i] *= alpha;
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                const float p = exp2f(s[u][g] - top);
                l[g] += p;
                float vf[ATTN_VEC];
                unpack_kv8(vw[u], vf);
#pragma unroll
                for (int i = 0; i < ATTN_VEC; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
            }
        }
    }

    // Merge the key slots of the warp (lanes holding the same chunk, KEY_LANES apart).
#pragma unroll
    for (int o = KEY_LANES; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const float m_other = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float l_other = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float top = fmaxf(m[g], m_other);
            const float a = top == -INFINITY ? 0.0f : exp2f(m[g] - top);
            const float b = top == -INFINITY ? 0.0f : exp2f(m_other - top);
            m[g] = top;
            l[g] = l[g] * a + l_other * b;
#pragma unroll
            for (int i = 0; i < ATTN_VEC; ++i) {
                const float other = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
                acc[g][i] = acc[g][i] * a + other * b;
            }
        }
    }
    if (sub == 0) {
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            if (lane == 0) {
                sm_m[g] = m[g];
                sm_l[g] = l[g];
            }
            if (active) {
#if KV_FP8
#pragma unroll
                for (int i = 0; i < ATTN_VEC; ++i) acc[g][i] *= v_scale;
#endif
                float4* dst = reinterpret_cast<float4*>(&sm_acc[g][chunk * ATTN_VEC]);
                dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
                dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
            }
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
paged_attention(const bf16* __restrict__ q,
                const kv_t* __restrict__ k_cache,
                const kv_t* __restrict__ v_cache,
                const float* __restrict__ kv_scales,
                const float* __restrict__ sinks,
                const int* __restrict__ block_tables,
                const int* __restrict__ max_blocks_word,
                const int* __restrict__ token_row,
                const int* __restrict__ positions,
                float* __restrict__ part_acc,
                float* __restrict__ part_ml,
                int* __restrict__ merge_counts,
                int splits,
                float scale,
                bf16* __restrict__ out) {
#if !ATTN_MMA
    await_previous_kernels();
#endif
    __shared__ float sm_m[ATTN_WARPS][GROUP];
    __shared__ int merges_here;
    __shared__ float sm_l[ATTN_WARPS][GROUP];
    __shared__ __align__(16) float sm_acc[ATTN_WARPS][GROUP][HEAD_DIM];

    const int t = blockIdx.x;
    const int kvh = blockIdx.y;
    const int split = blockIdx.z;
    const int row = token_row[t];
    const int pos = positions[t];
    const int n = attended(pos);
    const int mine = token_splits(n, splits);
    if (split >= mine) return;
    const int per = (n + mine - 1) / mine;
    const int partition = (per + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
    const int max_blocks = *max_blocks_word;
    const int first = pos + 1 - n;
    const int begin = first + split * partition;
    const int end = row < 0 ? begin : min(begin + partition, pos + 1);
    const int warp = threadIdx.x >> 5;
    const bf16* q_group = q + ((size_t)t * NUM_Q_HEADS + kvh * GROUP) * HEAD_DIM;
    const int* table = block_tables + (size_t)(row < 0 ? 0 : row) * max_blocks;
#if ATTN_MMA
    // Keys before the first position of the token's row in this step were written by earlier
    // steps (a row's tokens are consecutive in the step); the tensor-core path loads its first
    // tile of those before it waits for the previous kernel. The block table, positions and rows
    // come from the step's inputs, copied before any kernel of the step ran.
    const int stable_end = (t == 0 || token_row[t - 1] != row) ? pos : first;
    warp_attend_mma(q_group, k_cache, v_cache, table, kvh, begin, end, stable_end, key_scale(scale, kv_scales),
                    value_scale(kv_scales), sm_m[warp], sm_l[warp], sm_acc[warp]);
#else
    warp_attend_lanes(q_group, k_cache, v_cache, table, kvh, begin, end, key_scale(scale, kv_scales),
                      value_scale(kv_scales), sm_m[warp], sm_l[warp], sm_acc[warp]);
#endif
    __syncthreads();

    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += blockDim.x) {
        const int g = i / HEAD_DIM;
        const int d = i % HEAD_DIM;
        float big = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) big = fmaxf(big, sm_m[w][g]);
        float a = 0.0f;
        float total = 0.0f;
        if (big != -INFINITY) {
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; ++w) {
                const float f = exp2f(sm_m[w][g] - big);
                a += sm_acc[w][g][d] * f;
                total += sm_l[w][g] * f;
            }
        }
        const size_t head = (size_t)t * NUM_Q_HEADS + kvh * GROUP + g;
        if (mine == 1) {
            // As attention_reduce computes it for one partition (its merge factor is exactly 1).
            const float sum = sink_total(total, big, sinks, kvh * GROUP + g);
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            out[head * HEAD_DIM + d] = f32_to_bf16(a * inv);
            continue;
        }
        part_acc[(head * splits + split) * HEAD_DIM + d] = a;
        if (d == 0) {
            part_ml[(head * splits + split) * 2] = big;
            part_ml[(head * splits + split) * 2 + 1] = total;
        }
    }
    if (mine == 1 || splits > ATTN_MERGE_SPLITS) return;
    // Few splits: the token's last block to finish merges them (attention_reduce's arithmetic),
    // so no reduction launch follows. Every block publishes its partials, then counts itself in;
    // the block that brings the count to `mine` resets it for the next launch and merges. The
    // count's add is a release for the block's partial stores (ordered before it by the barrier)
    // and an acquire for the merging block's loads of the others' (ordered after it likewise), so
    // no separate fence waits on either side.
    __syncthreads();
    if (threadIdx.x == 0) {
        int* count = merge_counts + (size_t)t * NUM_KV_HEADS + kvh;
        int before;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(before) : "l"(count) : "memory");
        merges_here = before == mine - 1;
        if (merges_here) *count = 0;
    }
    __syncthreads();
    if (!merges_here) return;
    // One float4 of one head's output per thread: every split's partials are loaded from L2 at
    // once (one round trip), then merged.
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM / 4; i += blockDim.x) {
        const int g = i / (HEAD_DIM / 4);
        const int c = i % (HEAD_DIM / 4);
        const size_t head = (size_t)t * NUM_Q_HEADS + kvh * GROUP + g;
        const float2* ml = reinterpret_cast<const float2*>(part_ml) + head * splits;
        const float4* acc = reinterpret_cast<const float4*>(part_acc + head * splits * HEAD_DIM) + c;
        float2 parts[ATTN_MERGE_SPLITS];
        float4 values[ATTN_MERGE_SPLITS];
        float big = -INFINITY;
#pragma unroll
        for (int s = 0; s < ATTN_MERGE_SPLITS; ++s) {
            if (s < mine) {
                parts[s] = __ldcg(ml + s);
                values[s] = __ldcg(acc + (size_t)s * (HEAD_DIM / 4));
                big = fmaxf(big, parts[s].x);
            }
        }
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float total = 0.0f;
        if (big != -INFINITY) {
#pragma unroll
            for (int s = 0; s < ATTN_MERGE_SPLITS; ++s) {
                if (s < mine) {
                    const float f = exp2f(parts[s].x - big);
                    total += parts[s].y * f;
                    a.x = fmaf(values[s].x, f, a.x);
                    a.y = fmaf(values[s].y, f, a.y);
                    a.z = fmaf(values[s].z, f, a.z);
                    a.w = fmaf(values[s].w, f, a.w);
                }
            }
        }
        const float sum = sink_total(total, big, sinks, kvh * GROUP + g);
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        bf16* o = out + head * HEAD_DIM + 4 * c;
        o[0] = f32_to_bf16(a.x * inv);
        o[1] = f32_to_bf16(a.y * inv);
        o[2] = f32_to_bf16(a.z * inv);
        o[3] = f32_to_bf16(a.w * inv);
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_REDUCE_THREADS)
attention_reduce(const float* __restrict__ part_acc,
                 const float* __restrict__ part_ml,
                 const int* __restrict__ positions,
                 const float* __restrict__ sinks,
                 int splits,
                 int all_splits,
                 bf16* __restrict__ out) {
    // Few blocks, launched while paged_attention runs: the next kernel may take the SMs that
    // paged_attention frees before this launch has finished waiting for it.
    start_next_kernels();
    await_previous_kernels();
    __shared__ float scratch[32];
    __shared__ __align__(16) float sm_acc[REDUCE_ROWS][HEAD_DIM];
    const size_t head = (size_t)blockIdx.x * NUM_Q_HEADS + blockIdx.y;
    const int mine = all_splits ? splits : token_splits(attended(positions[blockIdx.x]), splits);
    if (!all_splits && mine == 1) return;  // paged_attention wrote this token's output
    const float* ml = part_ml + head * splits * 2;
    // The largest partial maximum and the rescaled total, over the block's threads.
    float big = -INFINITY;
    for (int s = threadIdx.x; s < mine; s += blockDim.x) big = fmaxf(big, ml[2 * s]);
    big = warp_max(big);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = big;
    __syncthreads();
    big = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) big = fmaxf(big, scratch[w]);
    __syncthreads();
    float total = 0.0f;
    if (big != -INFINITY) {
        for (int s = threadIdx.x; s < mine; s += blockDim.x) total += ml[2 * s + 1] * exp2f(ml[2 * s] - big);
    }
    total = block_sum(total, scratch);
    // REDUCE_ROWS rows of threads walk the splits, each thread 4 dimensions (16-byte loads).
    const int r = threadIdx.x / REDUCE_LANES;
    const int c = threadIdx.x % REDUCE_LANES;
    if (r < REDUCE_ROWS) {
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (big != -INFINITY) {
            const float4* acc4 = reinterpret_cast<const float4*>(part_acc + head * splits * HEAD_DIM);
#pragma unroll 4
            for (int s = r; s < mine; s += REDUCE_ROWS) {
                const float f = exp2f(ml[2 * s] - big);
                const float4 v = acc4[(size_t)s * (HEAD_DIM / 4) + c];
                a.x = fmaf(v.x, f, a.x);
                a.y = fmaf(v.y, f, a.y);
                a.z = fmaf(v.z, f, a.z);
                a.w = fmaf(v.w, f, a.w);
            }
        }
        reinterpret_cast<float4*>(sm_acc[r])[c] = a;
    }
    __syncthreads();
    const float sum = sink_total(total, big, sinks, blockIdx.y);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (int row = 0; row < REDUCE_ROWS; ++row) a += sm_acc[row][d];
        out[head * HEAD_DIM + d] = f32_to_bf16(a * inv);
    }
}
