// Paged attention for grouped-query heads, used for decode and prefill alike.
//
// Every step token t attends causally to positions [0, positions[t]] of its sequence (or the last
// SLIDING_WINDOW of them), reading keys and values from the paged cache through its row's block
// table. The QKV kernel has already written this step's keys and values, so a prefill chunk sees
// both earlier chunks and cached prefix blocks, and a decode token sees its whole context.
//
// paged_attention: grid (T, NUM_KV_HEADS, splits), ATTN_WARPS warps per block. A block serves all
// GROUP query heads of one KV head, so each key and value row is read once for the whole group.
// Split-K over long contexts: the host fixes `splits`, the most partitions per token (grid z,
// and the stride of the partial buffers), so a launch can be captured once in a CUDA graph and
// replayed for any context. Each token derives its own partition from its context length n:
// token_splits(n) = min(splits, ceil(n / ATTN_MIN_PARTITION)) partitions of
// ceil(n / token_splits) positions rounded up to whole KV blocks; blocks with z beyond that
// return at once and the reduction never reads their slots. ATTN_MIN_PARTITION equals
// MIN_PARTITION in src/backend/cuda/plan.rs (a unit test checks it). Warps take keys round-robin
// and keep an online softmax per head; the block merges its warps and writes an unnormalised
// partial result (acc, max, sum) per head and split.
// The block-table stride (max_blocks) is read from device memory, so a captured launch serves
// any table length.
// attention_reduce: grid (T, NUM_Q_HEADS) merges the token's splits and writes bf16
// [T, NUM_Q_HEADS * HEAD_DIM]. token_row[t] < 0 marks a padding token (its output is zero).

#define GROUP (NUM_Q_HEADS / NUM_KV_HEADS)
#define D_PER_LANE ((HEAD_DIM + 31) / 32)
#define ATTN_WARPS 4
#define ATTN_MIN_PARTITION 32

// Partitions of a token at position `pos` when the launch allows at most `splits`.
__device__ __forceinline__ int token_splits(int pos, int splits) {
    const int n = pos + 1;
    return min(splits, max(1, (n + ATTN_MIN_PARTITION - 1) / ATTN_MIN_PARTITION));
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
    __shared__ float qs[GROUP][HEAD_DIM];
    __shared__ float sm_m[ATTN_WARPS][GROUP];
    __shared__ float sm_l[ATTN_WARPS][GROUP];
    __shared__ float sm_acc[ATTN_WARPS][GROUP][HEAD_DIM];

    const int t = blockIdx.x;
    const int kvh = blockIdx.y;
    const int split = blockIdx.z;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row = token_row[t];
    const int pos = positions[t];
    const int mine = token_splits(pos, splits);
    if (split >= mine) return;
    const int per = (pos + 1 + mine - 1) / mine;
    const int partition = (per + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
    const int max_blocks = *max_blocks_word;

    int begin = split * partition;
    int end = min(begin + partition, pos + 1);
#if SLIDING_WINDOW > 0
    begin = max(begin, pos + 1 - SLIDING_WINDOW);
#endif
    if (row < 0) end = begin;

    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += blockDim.x) {
        const int g = i / HEAD_DIM;
        const int d = i % HEAD_DIM;
        qs[g][d] = bf16_to_f32(q[((size_t)t * NUM_Q_HEADS + kvh * GROUP + g) * HEAD_DIM + d]) * scale;
    }
    __syncthreads();

    float m[GROUP];
    float l[GROUP];
    float acc[GROUP][D_PER_LANE];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < D_PER_LANE; ++i) acc[g][i] = 0.0f;
    }

    const int* table = block_tables + (size_t)(row < 0 ? 0 : row) * max_blocks;
    for (int j = begin + warp; j < end; j += ATTN_WARPS) {
        const size_t slot = (size_t)table[j / KV_BLOCK] * KV_BLOCK + (j % KV_BLOCK);
        const bf16* kp = k_cache + (slot * NUM_KV_HEADS + kvh) * HEAD_DIM;
        const bf16* vp = v_cache + (slot * NUM_KV_HEADS + kvh) * HEAD_DIM;
        float kr[D_PER_LANE];
        float vr[D_PER_LANE];
#pragma unroll
        for (int i = 0; i < D_PER_LANE; ++i) {
            const int d = lane + 32 * i;
            kr[i] = d < HEAD_DIM ? bf16_to_f32(kp[d]) : 0.0f;
            vr[i] = d < HEAD_DIM ? bf16_to_f32(vp[d]) : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < D_PER_LANE; ++i) {
                const int d = lane + 32 * i;
                if (d < HEAD_DIM) dot += qs[g][d] * kr[i];
            }
            const float s = warp_sum(dot);
            const float m_new = fmaxf(m[g], s);
            const float alpha = expf(m[g] - m_new);
            const float p = expf(s - m_new);
            l[g] = l[g] * alpha + p;
            m[g] = m_new;
#pragma unroll
            for (int i = 0; i < D_PER_LANE; ++i) acc[g][i] = acc[g][i] * alpha + p * vr[i];
        }
    }

#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < D_PER_LANE; ++i) {
            const int d = lane + 32 * i;
            if (d < HEAD_DIM) sm_acc[warp][g][d] = acc[g][i];
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += blockDim.x) {
        const int g = i / HEAD_DIM;
        const int d = i % HEAD_DIM;
        float big = -INFINITY;
        for (int w = 0; w < ATTN_WARPS; ++w) big = fmaxf(big, sm_m[w][g]);
        float a = 0.0f;
        float total = 0.0f;
        if (big != -INFINITY) {
            for (int w = 0; w < ATTN_WARPS; ++w) {
                const float f = expf(sm_m[w][g] - big);
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

extern "C" __global__ void attention_reduce(const float* __restrict__ part_acc,
                                            const float* __restrict__ part_ml,
                                            const int* __restrict__ positions,
                                            int splits,
                                            bf16* __restrict__ out) {
    const size_t head = (size_t)blockIdx.x * NUM_Q_HEADS + blockIdx.y;
    const int mine = token_splits(positions[blockIdx.x], splits);
    const float* ml = part_ml + head * splits * 2;
    float big = -INFINITY;
    for (int s = 0; s < mine; ++s) big = fmaxf(big, ml[2 * s]);
    float total = 0.0f;
    if (big != -INFINITY) {
        for (int s = 0; s < mine; ++s) total += ml[2 * s + 1] * expf(ml[2 * s] - big);
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float a = 0.0f;
        if (big != -INFINITY) {
            for (int s = 0; s < mine; ++s) {
                a += part_acc[(head * splits + s) * HEAD_DIM + d] * expf(ml[2 * s] - big);
            }
        }
        out[head * HEAD_DIM + d] = f32_to_bf16(a * inv);
    }
}
