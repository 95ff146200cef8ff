// Paged attention for grouped-query heads (flash-decoding), used for decode and for prefill when
// the tiled prefill kernel cannot take the group.
//
// Every step token t attends causally to positions [0, positions[t]] of its sequence (or the last
// SLIDING_WINDOW of them), reading keys and values from the paged cache through its row's block
// table. The QKV kernel has already written this step's keys and values, so a prefill chunk sees
// both earlier chunks and cached prefix blocks, and a decode token sees its whole context.
//
// paged_attention: grid (T, NUM_KV_HEADS, splits), ATTN_WARPS warps per block (ATTN_WARPS and
// ATTN_MIN_PARTITION come from the host, src/backend/cuda/plan.rs). A block serves all GROUP
// query heads of one KV head, so each key and value row is read once for the whole group.
// Split-K over long contexts: the host fixes `splits`, the most partitions per token (grid z,
// and the stride of the partial buffers), so a launch can be captured once in a CUDA graph and
// replayed for any context. Each token derives its own partition from the n positions it attends
// to: token_splits(n) = min(splits, ceil(n / ATTN_MIN_PARTITION)) partitions of
// ceil(n / token_splits) positions rounded up to whole KV blocks; blocks with z beyond that
// return at once and the reduction never reads their slots.
//
// Inside a block: a key row is read with 16-byte loads by KEY_LANES lanes (8 bf16 each), so a
// warp covers KEYS_PER_PASS keys at once and issues ATTN_UNROLL such passes before it uses any
// of them (KEYS_PER_PASS * ATTN_UNROLL keys of K and V in flight per warp). Each lane keeps the
// query slice of every head of the group in registers, scores its keys for all heads (a partial
// dot product reduced over its KEY_LANES lanes), and keeps one online softmax per head and key
// slot, rescaled once per pass group. Scores are in the log2 domain (q is pre-scaled by
// scale * log2(e)) so every exponential is one exp2. At the end the key slots of a warp merge by
// shuffles, the warps merge in shared memory, and the block writes an unnormalised partial
// result (acc, max, sum) per head and split.
// The block-table stride (max_blocks) is read from device memory, so a captured launch serves
// any table length.
// attention_reduce: grid (T, NUM_Q_HEADS), ATTN_REDUCE_THREADS threads, merges the token's splits
// (rows of threads walk the splits in parallel, 16-byte loads) and writes bf16
// [T, NUM_Q_HEADS * HEAD_DIM]. token_row[t] < 0 marks a padding token (its output is zero).
// With `all_splits` set it merges all `splits` partials of every token instead of the token's own
// count: prefill_attention (kernels/prefill_attention.cu) splits a tile's keys evenly and writes
// every split.
// HEAD_DIM must be a multiple of 8 and at most 256 (the host refuses other shapes).

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
// attention_reduce: ATTN_REDUCE_THREADS threads (from the host) as REDUCE_ROWS rows of
// REDUCE_LANES threads, each thread 4 dimensions of one split at a time.
#define REDUCE_LANES (HEAD_DIM / 4)
#define REDUCE_ROWS (ATTN_REDUCE_THREADS / REDUCE_LANES)

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

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
paged_attention(const bf16* __restrict__ q,
                const bf16* __restrict__ k_cache,
                const bf16* __restrict__ v_cache,
                const int* __restrict__ block_tables,
                const int* __restrict__ max_blocks_word,
                const int* __restrict__ token_row,
                const int* __restrict__ positions,
                float* __restrict__ part_acc,
                float* __restrict__ part_ml,
                int splits,
                float scale) {
    await_previous_kernels();
    __shared__ float sm_m[ATTN_WARPS][GROUP];
    __shared__ float sm_l[ATTN_WARPS][GROUP];
    __shared__ __align__(16) float sm_acc[ATTN_WARPS][GROUP][HEAD_DIM];

    const int t = blockIdx.x;
    const int kvh = blockIdx.y;
    const int split = blockIdx.z;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int sub = lane / KEY_LANES;  // key slot of this lane within a pass
    const int chunk = lane % KEY_LANES;  // which 8 dimensions this lane holds
    const bool active = chunk < CHUNKS;
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

    // This lane's slice of every query head of the group, scaled into the log2 domain.
#if ATTN_Q_SHARED
    __shared__ __align__(16) float qs[GROUP][KEY_LANES * ATTN_VEC];
    for (int i = threadIdx.x; i < GROUP * KEY_LANES * ATTN_VEC; i += blockDim.x) {
        const int g = i / (KEY_LANES * ATTN_VEC);
        const int d = i % (KEY_LANES * ATTN_VEC);
        qs[g][d] = d < HEAD_DIM
            ? bf16_to_f32(q[((size_t)t * NUM_Q_HEADS + kvh * GROUP + g) * HEAD_DIM + d]) * (scale * LOG2E)
            : 0.0f;
    }
    __syncthreads();
#else
    float qf[GROUP][ATTN_VEC];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        if (active) {
            const uint4 w = *reinterpret_cast<const uint4*>(
                q + ((size_t)t * NUM_Q_HEADS + kvh * GROUP + g) * HEAD_DIM + chunk * ATTN_VEC);
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

    const int* table = block_tables + (size_t)(row < 0 ? 0 : row) * max_blocks;
    const size_t head_offset = (size_t)kvh * HEAD_DIM + chunk * ATTN_VEC;
    for (int base = begin + warp * KEYS_PER_WARP; base < end; base += ATTN_WARPS * KEYS_PER_WARP) {
        uint4 kw[ATTN_UNROLL];
        uint4 vw[ATTN_UNROLL];
        bool valid[ATTN_UNROLL];
        // Issue every load of the pass group before using any.
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            const int j = base + u * KEYS_PER_PASS + sub;
            valid[u] = j < end;
            kw[u] = make_uint4(0, 0, 0, 0);
            vw[u] = make_uint4(0, 0, 0, 0);
            if (valid[u] && active) {
                const size_t slot = (size_t)table[j / KV_BLOCK] * KV_BLOCK + (j % KV_BLOCK);
                const size_t offset = slot * NUM_KV_HEADS * HEAD_DIM + head_offset;
                kw[u] = __ldg(reinterpret_cast<const uint4*>(k_cache + offset));
                vw[u] = __ldg(reinterpret_cast<const uint4*>(v_cache + offset));
            }
        }
        float s[ATTN_UNROLL][GROUP];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; ++u) {
            float kf[ATTN_VEC];
            unpack8(kw[u], kf);
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
                unpack8(vw[u], vf);
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
                sm_m[warp][g] = m[g];
                sm_l[warp][g] = l[g];
            }
            if (active) {
                float4* dst = reinterpret_cast<float4*>(&sm_acc[warp][g][chunk * ATTN_VEC]);
                dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
                dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
            }
        }
    }
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
        part_acc[(head * splits + split) * HEAD_DIM + d] = a;
        if (d == 0) {
            part_ml[(head * splits + split) * 2] = big;
            part_ml[(head * splits + split) * 2 + 1] = total;
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_REDUCE_THREADS)
attention_reduce(const float* __restrict__ part_acc,
                 const float* __restrict__ part_ml,
                 const int* __restrict__ positions,
                 int splits,
                 int all_splits,
                 bf16* __restrict__ out) {
    await_previous_kernels();
    __shared__ float scratch[32];
    __shared__ __align__(16) float sm_acc[REDUCE_ROWS][HEAD_DIM];
    const size_t head = (size_t)blockIdx.x * NUM_Q_HEADS + blockIdx.y;
    const int mine = all_splits ? splits : token_splits(attended(positions[blockIdx.x]), splits);
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
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (int row = 0; row < REDUCE_ROWS; ++row) a += sm_acc[row][d];
        out[head * HEAD_DIM + d] = f32_to_bf16(a * inv);
    }
}
