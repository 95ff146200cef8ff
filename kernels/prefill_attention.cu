// Flash-style causal attention for prefill tiles, reading the whole context from the paged cache.
//
// A tile is up to F_TOKENS consecutive tokens of one sequence (the host packs (first token, count)
// per tile); grid (tiles, NUM_KV_HEADS), F_WARPS warps per block. A block holds the tile's
// F_ROWS = F_TOKENS * GROUP query vectors of one KV head in shared memory (scaled, fp32) and walks
// the sequence's KV blocks from the paged cache, KV_BLOCK keys at a time, staged in shared memory
// as bf16: every key and value is read once per tile and KV head instead of once per query token.
// The QKV kernel has already written this step's keys and values, so earlier chunks (chunked
// prefill) and cached prefix blocks are read exactly like this step's own keys.
// Each warp owns F_ROWS / F_WARPS = 4 query vectors, 8 lanes each: for a KV block, lane l scores
// its row against keys (l % 8) and (l % 8) + 8, the 8 lanes of a row merge the row's maximum and
// sum (online softmax, causal and sliding-window masks per query position), then each lane
// accumulates HEAD_DIM / 8 output dimensions of its row. The result, divided by the softmax sum,
// is written as bf16 to out [T, NUM_Q_HEADS * HEAD_DIM], like attention_reduce writes.
// F_ROWS equals FLASH_ROWS in src/backend/cuda/plan.rs (a unit test checks it).

#define F_ROWS 32
#define F_WARPS 8
#define F_GROUP (NUM_Q_HEADS / NUM_KV_HEADS)
#define F_TOKENS (F_GROUP <= F_ROWS ? F_ROWS / F_GROUP : 1)
#define F_DIMS ((HEAD_DIM + 7) / 8)
#define F_QSTRIDE (HEAD_DIM + 1)
#define F_KSTRIDE (HEAD_DIM + 2)

#if KV_BLOCK != 16
#error "prefill_attention assumes 16-token KV blocks (two keys per lane, eight lanes per row)"
#endif

extern "C" __global__ void __launch_bounds__(F_WARPS * 32)
prefill_attention(const bf16* __restrict__ q,
                  const bf16* __restrict__ k_cache,
                  const bf16* __restrict__ v_cache,
                  const int* __restrict__ block_tables,
                  const int* __restrict__ max_blocks_word,
                  const int* __restrict__ token_row,
                  const int* __restrict__ positions,
                  const int* __restrict__ tiles,
                  float scale,
                  bf16* __restrict__ out) {
    __shared__ float qs[F_ROWS * F_QSTRIDE];
    __shared__ bf16 ks[KV_BLOCK * F_KSTRIDE];
    __shared__ bf16 vs[KV_BLOCK * F_KSTRIDE];

    const int t0 = tiles[2 * blockIdx.x];
    const int count = tiles[2 * blockIdx.x + 1];
    const int kvh = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row = token_row[t0];
    const int* table = block_tables + (size_t)row * (*max_blocks_word);
    const int rows_used = min(min(count, F_TOKENS) * F_GROUP, F_ROWS);

    // Query vectors r = token * GROUP + g, pre-scaled.
    for (int i = threadIdx.x; i < F_ROWS * HEAD_DIM; i += blockDim.x) {
        const int r = i / HEAD_DIM;
        const int d = i % HEAD_DIM;
        float v = 0.0f;
        if (r < rows_used) {
            const int t = t0 + r / F_GROUP;
            const int h = kvh * F_GROUP + r % F_GROUP;
            v = bf16_to_f32(q[((size_t)t * NUM_Q_HEADS + h) * HEAD_DIM + d]) * scale;
        }
        qs[r * F_QSTRIDE + d] = v;
    }

    // This lane's row and its query position (-1: an unused row, every key masked).
    const int my_row = warp * 4 + (lane >> 3);
    const int sub = lane & 7;
    const int my_pos = my_row < rows_used ? positions[t0 + my_row / F_GROUP] : -1;
    int my_lo = 0;
#if SLIDING_WINDOW > 0
    my_lo = max(0, my_pos + 1 - SLIDING_WINDOW);
#endif
    const int last_pos = positions[t0 + min(count, F_TOKENS) - 1];
    int first_pos = 0;
#if SLIDING_WINDOW > 0
    first_pos = max(0, positions[t0] + 1 - SLIDING_WINDOW);
#endif

    float m = -INFINITY;
    float l = 0.0f;
    float acc[F_DIMS];
#pragma unroll
    for (int i = 0; i < F_DIMS; ++i) acc[i] = 0.0f;

    for (int b = first_pos / KV_BLOCK; b <= last_pos / KV_BLOCK; ++b) {
        __syncthreads();
        const size_t base = (size_t)table[b] * KV_BLOCK;
        for (int i = threadIdx.x; i < KV_BLOCK * HEAD_DIM; i += blockDim.x) {
            const int k = i / HEAD_DIM;
            const int d = i % HEAD_DIM;
            const size_t src = ((base + k) * NUM_KV_HEADS + kvh) * HEAD_DIM + d;
            ks[k * F_KSTRIDE + d] = k_cache[src];
            vs[k * F_KSTRIDE + d] = v_cache[src];
        }
        __syncthreads();

        // Scores of this lane's row against keys sub and sub + 8.
        const int j0 = b * KV_BLOCK + sub;
        const int j1 = j0 + 8;
        float s0 = 0.0f;
        float s1 = 0.0f;
        const float* qr = qs + my_row * F_QSTRIDE;
        const bf16* k0 = ks + sub * F_KSTRIDE;
        const bf16* k1 = ks + (sub + 8) * F_KSTRIDE;
#pragma unroll 8
        for (int d = 0; d < HEAD_DIM; ++d) {
            const float x = qr[d];
            s0 += x * bf16_to_f32(k0[d]);
            s1 += x * bf16_to_f32(k1[d]);
        }
        const bool ok0 = j0 <= my_pos && j0 >= my_lo;
        const bool ok1 = j1 <= my_pos && j1 >= my_lo;
        s0 = ok0 ? s0 : -INFINITY;
        s1 = ok1 ? s1 : -INFINITY;

        float bm = fmaxf(s0, s1);
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
        const float m_new = fmaxf(m, bm);
        const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);
        const float p0 = s0 == -INFINITY ? 0.0f : expf(s0 - m_new);
        const float p1 = s1 == -INFINITY ? 0.0f : expf(s1 - m_new);
        float ps = p0 + p1;
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * alpha + ps;
        m = m_new;

#pragma unroll
        for (int i = 0; i < F_DIMS; ++i) acc[i] *= alpha;
        const int group_base = lane & ~7;
#pragma unroll
        for (int k = 0; k < KV_BLOCK; ++k) {
            const float pk = __shfl_sync(0xffffffffu, k < 8 ? p0 : p1, group_base | (k & 7));
            const bf16* vr = vs + k * F_KSTRIDE;
#pragma unroll
            for (int i = 0; i < F_DIMS; ++i) {
                const int d = sub + 8 * i;
                if (d < HEAD_DIM) acc[i] += pk * bf16_to_f32(vr[d]);
            }
        }
    }

    if (my_row < rows_used) {
        const int t = t0 + my_row / F_GROUP;
        const int h = kvh * F_GROUP + my_row % F_GROUP;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        bf16* dst = out + ((size_t)t * NUM_Q_HEADS + h) * HEAD_DIM;
#pragma unroll
        for (int i = 0; i < F_DIMS; ++i) {
            const int d = sub + 8 * i;
            if (d < HEAD_DIM) dst[d] = f32_to_bf16(acc[i] * inv);
        }
    }
}
