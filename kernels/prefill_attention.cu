// Causal prefill attention on tensor cores (FlashAttention-2 style), reading the whole context
// from the paged cache.
//
// A tile is up to F_TOKENS consecutive tokens of one sequence (the host packs (first token, count)
// per tile); grid (tiles, NUM_KV_HEADS, splits), F_WARPS = F_ROWS / 16 warps per block. A block
// serves the tile's query vectors r = token * GROUP + g (g: the query heads of one KV head),
// F_ROWS rows of which each warp owns 16, and walks its share of the sequence's keys F_KEYS at a
// time. The keys and values of each key tile (this KV head's rows of the cache blocks) are copied
// into shared memory with cp.async, in two stages: the next tile's copy runs while the warps use
// this one. Rows are padded to HEAD_DIM + 8 bf16 so the ldmatrix reads of eight rows hit eight
// different banks. Each key and value is thus read once per tile and KV head, for all its query
// rows. The QKV kernel has already written this step's keys and values, so earlier chunks
// (chunked prefill) and cached prefix blocks are read exactly like this step's own; slots outside
// [first position, last position] of the tile's rows are never read (their stage is filled with
// zeros).
//
// Per warp and key tile (mma.sync m16n8k16, bf16 inputs, fp32 accumulation):
//   S = Q K^T: the warp's 16 query rows (A fragments, loaded once from global memory) against the
//       tile's keys (B fragments by ldmatrix from the staged rows);
//   scores masked (causal: key <= the row's position; sliding window: key > position -
//       SLIDING_WINDOW) only in key tiles that cross a row's range, online softmax per row over
//       the raw scores (max and sum), the scale into the log2 domain folded into each exp2's
//       argument (one FMA);
//   O += P V: P rounded to bf16 straight from the S accumulators (their fragment layout is the A
//       layout of the next product), V by ldmatrix.trans; O is rescaled only when a maximum of
//       the warp's rows moved (else every factor is exactly 1).
// A key tile entirely after a warp's last row position is skipped by that warp (causal skip).
// The instructions around the products, not the products, bound this kernel (ncu: 2 issued per
// cycle, 12 warps per SM at 168 registers): every one saved per key tile counts.
//
// Split over the context: with `splits` > 1 (grid z), block z walks only the z-th of `splits`
// equal runs of the tile's key tiles and writes unnormalised partial results (acc, and max and
// sum per row, the max in the log2 domain) to part_acc / part_ml at (query head of the token) *
// splits + z, the layout paged_attention writes; attention_reduce (kernels/attention.cu), told to read all
// `splits`, merges them. Every block writes all its rows, an empty run as max -inf and sum 0, so
// a tile needs no split count of its own. This keeps a step whose few tiles attend to a long
// context (a late chunk of a long prompt) from running as one partial wave. With `splits` = 1
// the 4 lanes of a row merge their partial sums and the block writes O / sum as bf16 to out
// [T, NUM_Q_HEADS * HEAD_DIM], like attention_reduce writes.
//
// F_ROWS and F_KEYS come from the host (src/backend/cuda/plan.rs: FLASH_ROWS, FLASH_KEYS). The
// kernel serves head_dim multiples of 16 up to 128 on sm_80 or newer; for other shapes the host
// sends prefill through the paged kernel (plan::flash_tile_tokens returns 0) and this entry point
// is an empty body. Measured (docs/benchmarks.md): 64 rows beat 128, two 32-key stages beat one
// 64-key stage loaded synchronously, two 16-row tiles per warp (the query rows staged in shared
// memory, each K/V fragment serving both) lost 25% at 8k (at 242 registers only 8 warps fit per
// SM against 12), and the lazy rescale with boundary-only masks gained 7-19%.

#define F_GROUP (NUM_Q_HEADS / NUM_KV_HEADS)
#define F_WARPS (F_ROWS / 16)
#define F_TOKENS (F_ROWS / F_GROUP)
#define F_STRIDE (HEAD_DIM + 8)
#define F_DSTEPS (HEAD_DIM / 16)
#define F_DTILES (HEAD_DIM / 8)
#define F_KTILES (F_KEYS / 8)
#define F_CHUNKS (HEAD_DIM / 8)
#define F_LOG2E 1.4426950408889634f

#if HEAD_DIM % 16 == 0 && HEAD_DIM <= 128 && F_GROUP <= F_ROWS && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define F_SUPPORTED 1
#else
#define F_SUPPORTED 0
#endif

#if F_SUPPORTED
// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned int f_shared_address(const void* p) {
    unsigned int address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
    return address;
}

// Four 8x8 bf16 matrices from shared memory (thread i names row i % 8 of matrix i / 8).
__device__ __forceinline__ void f_ldmatrix_x4(unsigned int address, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// The same, each matrix transposed.
__device__ __forceinline__ void f_ldmatrix_x4_trans(unsigned int address, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// Copies 16 bytes from global to shared memory asynchronously (zeros when `valid` is false).
__device__ __forceinline__ void f_copy16_async(unsigned int dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

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
                  int splits,
                  bf16* __restrict__ out,
                  float* __restrict__ part_acc,
                  float* __restrict__ part_ml) {
    await_previous_kernels();
#if F_SUPPORTED
    // Two stages of keys and values: the next tile is copied while this one is used.
    __shared__ __align__(16) bf16 ks[2][F_KEYS * F_STRIDE];
    __shared__ __align__(16) bf16 vs[2][F_KEYS * F_STRIDE];

    const int t0 = tiles[2 * blockIdx.x];
    const int tokens = min(tiles[2 * blockIdx.x + 1], F_TOKENS);
    const int kvh = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int* table = block_tables + (size_t)token_row[t0] * (*max_blocks_word);
    const int rows_used = tokens * F_GROUP;

    // The block's key range: from the first token's window start to the last token's position.
    const int last_pos = positions[t0 + tokens - 1];
    int first_pos = 0;
#if SLIDING_WINDOW > 0
    first_pos = max(0, positions[t0] + 1 - SLIDING_WINDOW);
#endif
    // This block's run of whole key tiles: the blockIdx.z-th of `splits`.
    const int first_tile = first_pos / F_KEYS;
    const int per_split = (last_pos / F_KEYS - first_tile + splits) / splits;
    const int kb_begin = (first_tile + (int)blockIdx.z * per_split) * F_KEYS;
    const int kb_end = min((first_tile + ((int)blockIdx.z + 1) * per_split) * F_KEYS, last_pos + 1);

    // This thread's two rows of the warp's 16 (fragment rows lane / 4 and lane / 4 + 8), their
    // positions (-1: an unused row, every key masked), and the warp's last position.
    const int quad = lane >> 2;
    const int pair = (lane & 3) * 2;
    const int row_a = warp * 16 + quad;
    const int row_b = row_a + 8;
    const int pos_a = row_a < rows_used ? positions[t0 + row_a / F_GROUP] : -1;
    const int pos_b = row_b < rows_used ? positions[t0 + row_b / F_GROUP] : -1;
    const int warp_last_row = min(warp * 16 + 15, rows_used - 1);
    const int warp_last_pos = warp * 16 < rows_used ? positions[t0 + warp_last_row / F_GROUP] : -1;
    const int warp_first_pos = warp * 16 < rows_used ? positions[t0 + warp * 16 / F_GROUP] : -1;

    // Q fragments: rows a and b, dimensions pair and pair + 8 of every 16-dimension step.
    unsigned int qa[F_DSTEPS][4];
    {
        const bf16* qrow_a = q + ((size_t)(t0 + row_a / F_GROUP) * NUM_Q_HEADS + kvh * F_GROUP + row_a % F_GROUP) * HEAD_DIM;
        const bf16* qrow_b = q + ((size_t)(t0 + row_b / F_GROUP) * NUM_Q_HEADS + kvh * F_GROUP + row_b % F_GROUP) * HEAD_DIM;
#pragma unroll
        for (int s = 0; s < F_DSTEPS; ++s) {
            const int d = s * 16 + pair;
            qa[s][0] = pos_a >= 0 ? *reinterpret_cast<const unsigned int*>(qrow_a + d) : 0u;
            qa[s][1] = pos_b >= 0 ? *reinterpret_cast<const unsigned int*>(qrow_b + d) : 0u;
            qa[s][2] = pos_a >= 0 ? *reinterpret_cast<const unsigned int*>(qrow_a + d + 8) : 0u;
            qa[s][3] = pos_b >= 0 ? *reinterpret_cast<const unsigned int*>(qrow_b + d + 8) : 0u;
        }
    }

    float o[F_DTILES][4];
#pragma unroll
    for (int i = 0; i < F_DTILES; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY;
    float l_a = 0.0f, l_b = 0.0f;
    const float log2_scale = scale * F_LOG2E;

    // ldmatrix row addresses of this thread: matrix lane / 8, row lane % 8.
    const int mat = lane >> 3;
    const int mrow = lane & 7;
    const unsigned int ks_stage0 = f_shared_address(ks[0]);
    const unsigned int vs_stage0 = f_shared_address(vs[0]);
    const unsigned int stage_bytes = F_KEYS * F_STRIDE * 2;

    // Starts copying the keys and values of the tile at key `kb` into stage `buf` (zeros outside
    // [first_pos, last_pos]).
    auto stage = [&](int kb, int buf) {
#pragma unroll
        for (int i = threadIdx.x; i < F_KEYS * F_CHUNKS; i += F_WARPS * 32) {
            const int key = i / F_CHUNKS;
            const int chunk = i % F_CHUNKS;
            const int j = kb + key;
            const bool valid = j >= first_pos && j <= last_pos;
            size_t offset = 0;
            if (valid) {
                const size_t slot = (size_t)table[j / KV_BLOCK] * KV_BLOCK + j % KV_BLOCK;
                offset = (slot * NUM_KV_HEADS + kvh) * HEAD_DIM + chunk * 8;
            }
            const unsigned int at = 2 * (key * F_STRIDE + chunk * 8);
            f_copy16_async(ks_stage0 + buf * stage_bytes + at, k_cache + offset, valid);
            f_copy16_async(vs_stage0 + buf * stage_bytes + at, v_cache + offset, valid);
        }
        asm volatile("cp.async.commit_group;");
    };

    int kb = kb_begin;
    if (kb < kb_end) stage(kb, 0);
    for (int buf = 0; kb < kb_end; kb += F_KEYS, buf ^= 1) {
        // This tile has landed, and every warp is done with the other stage: refill it.
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        if (kb + F_KEYS < kb_end) stage(kb + F_KEYS, buf ^ 1);
        if (kb > warp_last_pos) continue;  // every key after every row of this warp
        const unsigned int k_stage = ks_stage0 + buf * stage_bytes;
        const unsigned int v_stage = vs_stage0 + buf * stage_bytes;

        // S = Q K^T over the tile's keys, two 8-key tiles per ldmatrix.x4.
        float s[F_KTILES][4];
#pragma unroll
        for (int n = 0; n < F_KTILES; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int n = 0; n < F_KTILES; n += 2) {
            const int key = (n + (mat >> 1)) * 8 + mrow;
#pragma unroll
            for (int d = 0; d < F_DSTEPS; ++d) {
                unsigned int b[4];
                f_ldmatrix_x4(k_stage + 2 * (key * F_STRIDE + d * 16 + (mat & 1) * 8), b);
                mma_bf16(s[n], qa[d], b[0], b[1]);
                mma_bf16(s[n + 1], qa[d], b[2], b[3]);
            }
        }

        // Mask the raw scores where a key of the tile may fall outside a row's range (causal:
        // key <= the row's position; sliding window: key > position - SLIDING_WINDOW), and
        // update the running maxima (of raw scores: the scale is positive).
        bool whole = kb + F_KEYS - 1 <= warp_first_pos;
#if SLIDING_WINDOW > 0
        whole = whole && kb > warp_last_pos - SLIDING_WINDOW;
#endif
        if (!whole) {
#pragma unroll
            for (int n = 0; n < F_KTILES; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = kb + n * 8 + pair + e;
                    bool ok_a = j <= pos_a;
                    bool ok_b = j <= pos_b;
#if SLIDING_WINDOW > 0
                    ok_a = ok_a && j > pos_a - SLIDING_WINDOW;
                    ok_b = ok_b && j > pos_b - SLIDING_WINDOW;
#endif
                    if (!ok_a) s[n][e] = -INFINITY;
                    if (!ok_b) s[n][2 + e] = -INFINITY;
                }
            }
        }
        float top_a = m_a, top_b = m_b;
#pragma unroll
        for (int n = 0; n < F_KTILES; ++n) {
            top_a = fmaxf(top_a, fmaxf(s[n][0], s[n][1]));
            top_b = fmaxf(top_b, fmaxf(s[n][2], s[n][3]));
        }
#pragma unroll
        for (int x = 1; x < 4; x <<= 1) {
            top_a = fmaxf(top_a, __shfl_xor_sync(0xffffffffu, top_a, x));
            top_b = fmaxf(top_b, __shfl_xor_sync(0xffffffffu, top_b, x));
        }
        // Scaled into the log2 domain only inside the exponentials; a row with no key yet
        // subtracts 0 (its scores are all -inf, their exponentials 0).
        const float base_a = top_a == -INFINITY ? 0.0f : top_a * log2_scale;
        const float base_b = top_b == -INFINITY ? 0.0f : top_b * log2_scale;
        const float alpha_a = exp2f(fmaf(m_a, log2_scale, -base_a));
        const float alpha_b = exp2f(fmaf(m_b, log2_scale, -base_b));
        // The accumulators are rescaled only when a maximum of the warp's rows moved (else every
        // factor is exactly 1).
        const bool moved = __any_sync(0xffffffffu, top_a != m_a || top_b != m_b);
        m_a = top_a;
        m_b = top_b;

        // P = exp2(S * scale - max), its row sums, and P as the A fragments of P V (16 keys per
        // step).
        unsigned int p[F_KTILES / 2][4];
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int n = 0; n < F_KTILES; ++n) {
            const float p0 = exp2f(fmaf(s[n][0], log2_scale, -base_a));
            const float p1 = exp2f(fmaf(s[n][1], log2_scale, -base_a));
            const float p2 = exp2f(fmaf(s[n][2], log2_scale, -base_b));
            const float p3 = exp2f(fmaf(s[n][3], log2_scale, -base_b));
            sum_a += p0 + p1;
            sum_b += p2 + p3;
            p[n / 2][(n & 1) * 2] = pack_bf16x2(p0, p1);
            p[n / 2][(n & 1) * 2 + 1] = pack_bf16x2(p2, p3);
        }
        l_a = l_a * alpha_a + sum_a;
        l_b = l_b * alpha_b + sum_b;
        if (moved) {
#pragma unroll
            for (int i = 0; i < F_DTILES; ++i) {
                o[i][0] *= alpha_a;
                o[i][1] *= alpha_a;
                o[i][2] *= alpha_b;
                o[i][3] *= alpha_b;
            }
        }

        // O += P V, two 8-dimension tiles per ldmatrix.x4.trans.
#pragma unroll
        for (int k = 0; k < F_KEYS / 16; ++k) {
            const int key = k * 16 + (mat & 1) * 8 + mrow;
#pragma unroll
            for (int i = 0; i < F_DTILES; i += 2) {
                unsigned int b[4];
                f_ldmatrix_x4_trans(v_stage + 2 * (key * F_STRIDE + i * 8 + (mat >> 1) * 8), b);
                mma_bf16(o[i], p[k], b[0], b[1]);
                mma_bf16(o[i + 1], p[k], b[2], b[3]);
            }
        }
    }

    // Merge the row sums of the 4 lanes that share a row, then write O / sum (one split) or the
    // unnormalised partial result (several).
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, x);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, x);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = half ? row_b : row_a;
        if ((half ? pos_b : pos_a) < 0) continue;
        const size_t head = (size_t)(t0 + row / F_GROUP) * NUM_Q_HEADS + kvh * F_GROUP + row % F_GROUP;
        const float l = half ? l_b : l_a;
        if (splits == 1) {
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
            for (int i = 0; i < F_DTILES; ++i) {
                *reinterpret_cast<unsigned int*>(out + head * HEAD_DIM + i * 8 + pair) =
                    pack_bf16x2(o[i][2 * half] * inv, o[i][2 * half + 1] * inv);
            }
        } else {
            const size_t part = head * splits + blockIdx.z;
#pragma unroll
            for (int i = 0; i < F_DTILES; ++i) {
                *reinterpret_cast<float2*>(part_acc + part * HEAD_DIM + i * 8 + pair) =
                    make_float2(o[i][2 * half], o[i][2 * half + 1]);
            }
            if (pair == 0) {
                part_ml[2 * part] = (half ? m_b : m_a) * log2_scale;  // -inf stays -inf
                part_ml[2 * part + 1] = l;
            }
        }
    }
#endif
}
