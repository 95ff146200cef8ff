// Causal prefill attention on tensor cores (FlashAttention-2 style), reading the whole context
// from the paged cache.
//
// A tile is up to F_TOKENS consecutive tokens of one sequence (the host packs (first token, count)
// per tile); grid (tiles, NUM_KV_HEADS, splits), F_WARPS = F_ROWS / 16 warps per block (and a
// producer warpgroup in the F_WGMMA path). A block
// serves the tile's query vectors r = token * GROUP + g (g: the query heads of one KV head),
// F_ROWS rows of which each warp owns 16, and walks its share of the sequence's keys F_KEYS at a
// time. The keys and values of each key tile (this KV head's rows of the cache blocks) are copied
// into shared memory with cp.async, in stages: the next tile's copy runs while the warps use
// this one. Each key and value is thus read once per tile and KV head, for all its query rows.
// The QKV kernel has already written this step's keys and values, so earlier chunks
// (chunked prefill) and cached prefix blocks are read exactly like this step's own; slots outside
// [first position, last position] of the tile's rows are never read (their stage is filled with
// zeros).
//
// Per key tile, in one of two product paths (F_WGMMA from the host), bf16 inputs, fp32 sums:
//   S = Q K^T: the query rows (loaded once from global memory: A fragments in registers, or
//       in shared memory in the F_WGMMA path) against the tile's keys;
//   scores masked (causal: key <= the row's position; sliding window: key > position -
//       SLIDING_WINDOW) only in key tiles that cross a row's range, online softmax per row over
//       the raw scores (max and sum), the scale into the log2 domain folded into each exp2's
//       argument (one FMA);
//   O += P V: P rounded to bf16 straight from the S accumulators (their fragment layout is the A
//       layout of the next product); O is rescaled only when a maximum of the warp's rows moved
//       (else every factor is exactly 1).
// F_WGMMA 0 (mma.sync m16n8k16, sm_80 on): each warp multiplies its 16 rows by B fragments it
// reads with ldmatrix (ldmatrix.trans for V) from rows padded to HEAD_DIM + 8 bf16, so eight rows'
// reads hit eight different banks; a key tile entirely after a warp's last row position is skipped
// by that warp. The instructions around the products bound it (ncu: 2 issued per cycle, 12 warps
// per SM at 168 registers).
// F_WGMMA 1 (Hopper wgmma.mma_async m64n128k16 and m64n64k16, sm_90a, HEAD_DIM 64 or 128): a
// block is two consumer warpgroups (64 rows each) and a producer warpgroup (F_THREADS). The
// producer copies each key tile into one of F_STAGES stages of dynamic shared memory (F_SHARED
// bytes, in the 128-byte-swizzled layout wgmma reads: K as a K-major B operand, V as an N-major
// one) once every consumer warp has released that stage, and the copies' completion arrives on
// the stage's mbarrier; consumers wait on it, so no block barrier per tile holds the two
// warpgroups in step. Each consumer warpgroup issues its products asynchronously, S = Q K^T with
// Q from shared memory (staged once, so it takes no registers) and O += P V with P from
// registers, in a software pipeline: tile i's softmax runs while the tensor cores multiply tile
// i - 1's P by its V. A warpgroup without rows returns at once. Tiles of at most FS_ROWS query
// vectors go to the small-tile variant (F_SMALL_VARIANT) instead (src/backend/cuda/inputs.rs:
// pack_step). ptxas serialises every product of the kernel (C7513, C7512) when an instruction
// writes a register an unfinished product reads or the registers run short; the pipeline is
// written so that neither happens (checked on the ptxas of CUDA 13.0; docs/cuda-backend.md,
// "Measured design choices").
//
// Split over the context: with `splits` > 1 (grid z), block z walks only the z-th of `splits`
// equal runs of the tile's key tiles and writes unnormalised partial results (acc, and max and
// sum per row, the max in the log2 domain) to part_acc / part_ml at (query head of the token) *
// splits + z, the layout paged_attention writes; attention_reduce (kernels/attention.cu), told to read all
// `splits`, merges them. Every block writes all its rows, an empty run as max -inf and sum 0, so
// a tile needs no split count of its own. This keeps a step whose few tiles attend to a long
// context (a late chunk of a long prompt) from running as one partial wave. With `splits` = 1
// the 4 lanes of a row merge their partial sums and the block writes O / sum as bf16 to out
// [T, NUM_Q_HEADS * HEAD_DIM], like attention_reduce writes. With ATTN_SINKS (prelude.cuh) the
// row's sink joins the sum there (split: in attention_reduce), never the key tiles' softmax.
//
// F_WGMMA, F_ROWS, F_KEYS and F_SHARED come from the host (src/backend/cuda/plan.rs:
// flash_geometry). The kernel serves head_dim multiples of 16 up to 128 on sm_80 or newer; for
// other shapes the host sends prefill through the paged kernel (plan::flash_tile_tokens returns 0)
// and this entry point is an empty body. Measured for the mma.sync path (docs/cuda-backend.md): 64
// rows beat 128, two 32-key stages beat one 64-key stage loaded synchronously, two 16-row tiles per
// warp lost 25% at 8k (242 registers), and the lazy rescale with boundary-only masks gained 7-19%.

// An FP8 cache (KV_FP8, prelude.cuh) takes the mma.sync path (the host asks for no warpgroup
// geometry): each thread loads its 8-byte chunks of E4M3 keys and values into registers, widens
// them to bf16 and stores them where the bf16 path's cp.async puts them, so the products are the
// bf16 path's. The layer's k scale multiplies the softmax scale, and its v scale the accumulators
// before they are written.

// The small-tile variant (family prefill_attention_small.cu, this source after
// `#define F_SMALL_VARIANT`): the mma.sync path in the host's FS_ROWS / FS_KEYS geometry, for
// tiles of at most FS_ROWS query vectors (a mixed step's decode rows, a chunk's short tail),
// which several blocks per SM then serve.
// The full-attention variants (families prefill_attention_full.cu and
// prefill_attention_small_full.cu, after `#define ATTN_FULL_VARIANT`): as attention.cu's, without
// the sliding window, for the full layers of a model whose layers alternate, entry points
// suffixed _full.
#ifdef ATTN_FULL_VARIANT
#undef SLIDING_WINDOW
#define SLIDING_WINDOW 0
#endif
#ifdef F_SMALL_VARIANT
#undef F_WGMMA
#undef F_ROWS
#undef F_KEYS
#undef F_SHARED
#define F_WGMMA 0
#define F_ROWS FS_ROWS
#define F_KEYS FS_KEYS
#define F_SHARED 0
#ifdef ATTN_FULL_VARIANT
#define prefill_attention prefill_attention_small_full
#else
#define prefill_attention prefill_attention_small
#endif
#elif defined(ATTN_FULL_VARIANT)
#define prefill_attention prefill_attention_full
#endif

#define F_GROUP (NUM_Q_HEADS / NUM_KV_HEADS)
#define F_WARPS (F_ROWS / 16)
#define F_TOKENS (F_ROWS / F_GROUP)
#define F_STRIDE (HEAD_DIM + 8)
#define F_DSTEPS (HEAD_DIM / 16)
#define F_DTILES (HEAD_DIM / 8)
#define F_KTILES (F_KEYS / 8)
#define F_CHUNKS (HEAD_DIM / 8)
#define F_LOG2E 1.4426950408889634f
#define F_HALF_BYTES (F_KEYS * 128)
#define F_TILE_BYTES (F_KEYS * HEAD_DIM * 2)
#define F_STAGES 3
// Bytes of one warpgroup's 64 query rows in shared memory.
#define F_Q_BYTES (64 * HEAD_DIM * 2)
// Registers per thread of the producer warpgroup and of the consumers (setmaxnreg): 128 x 24 +
// 256 x 240 fit the 64K registers of the SM the block has to itself.
#define F_PRODUCER_REGS 24
#define F_CONSUMER_REGS 240
// Keys per S = Q K^T product of the wgmma path: 128 where the tile allows (half the products, and
// the A fragments read half as often, as with 64).
#if F_KEYS % 128 == 0
#define F_QK_N 128
#else
#define F_QK_N 64
#endif

#if F_WGMMA && KV_FP8
#error "an FP8 cache takes the mma.sync path (plan::flash_geometry)"
#endif
#if F_WGMMA && (HEAD_DIM % 64 != 0 || F_KEYS % 64 != 0 || F_ROWS % 64 != 0)
#error "F_WGMMA needs HEAD_DIM, F_KEYS and F_ROWS multiples of 64"
#endif
#if HEAD_DIM % 16 == 0 && HEAD_DIM <= 128 && F_GROUP <= F_ROWS && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define F_SUPPORTED 1
#else
#define F_SUPPORTED 0
#endif

#if F_SUPPORTED
// ldmatrix_x4 (prelude.cuh) with each matrix transposed.
__device__ __forceinline__ void f_ldmatrix_x4_trans(unsigned int address, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

#if F_WGMMA
// Warpgroup products (Hopper wgmma): the accumulators and A fragments a warpgroup's registers
// hold must not be touched between f_wgmma_fence and f_wgmma_wait except by wgmma itself.
__device__ __forceinline__ void f_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void f_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void f_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Orders later uses of N accumulators after the wait that completed them (the compiler sees no
// other dependency between the asynchronous product and the registers it writes).
template <int N>
__device__ __forceinline__ void f_fence_operands(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for N 32-bit registers (the A fragments a product reads).
template <int N>
__device__ __forceinline__ void f_fence_registers(unsigned int* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// An mbarrier in shared memory, its phases completed by `count` arrivals each.
__device__ __forceinline__ void f_barrier_init(unsigned long long* bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

// Waits until the phase of `parity` (0 for a barrier's 1st, 3rd, ... phase) has completed.
__device__ __forceinline__ void f_barrier_wait(unsigned long long* bar, unsigned int parity) {
    unsigned int done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(shared_address(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

// One arrival on `bar`.
__device__ __forceinline__ void f_barrier_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// The shared-memory descriptor of a 128-byte-swizzled operand at `address` (1024-byte aligned
// swizzle atoms of 8 rows of 128 bytes; `stride` bytes between 8-row groups).
__device__ __forceinline__ unsigned long long f_descriptor(unsigned int address, unsigned int leading,
                                                           unsigned int stride) {
    return (unsigned long long)((address & 0x3FFFF) >> 4) | ((unsigned long long)(leading >> 4) << 16) |
           ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}

// Eight accumulators d[I] to d[I + 7] as read-write operands of a wgmma asm statement.
#define F_ACC8(I)                                                                                  \
    "+f"(d[I]), "+f"(d[I + 1]), "+f"(d[I + 2]), "+f"(d[I + 3]), "+f"(d[I + 4]), "+f"(d[I + 5]), \
        "+f"(d[I + 6]), "+f"(d[I + 7])

// d (64 x 64, fp32, the m64n64 accumulator layout: warp w of the warpgroup holds rows 16w..16w+15
// as mma.sync m16n8k16's C tiles 0-7) += a (64 x 16 bf16 from registers, mma.sync's A layout per
// warp) * b (16 x 64 from shared memory, N-major, described by `b`): O += P V.
__device__ __forceinline__ void f_wgmma_64x64_rs(float* d, const unsigned int* a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : F_ACC8(0), F_ACC8(8), F_ACC8(16), F_ACC8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
}

// d (64 x 64) (+)= a (64 x 16 from shared memory, K-major, described by `a`) * b (16 x 64, K-major).
__device__ __forceinline__ void f_wgmma_64x64_ss(float* d, unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : F_ACC8(0), F_ACC8(8), F_ACC8(16), F_ACC8(24)
        : "l"(a), "l"(b), "r"(accumulate)
        : "memory");
}

// The same with N = 128 (d: 64 accumulators).
__device__ __forceinline__ void f_wgmma_64x128_ss(float* d, unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : F_ACC8(0), F_ACC8(8), F_ACC8(16), F_ACC8(24), F_ACC8(32), F_ACC8(40), F_ACC8(48), F_ACC8(56)
        : "l"(a), "l"(b), "r"(accumulate)
        : "memory");
}

// The same with N = 128: d holds 64 accumulators (the m64n128 layout: C tiles 0-15 per warp).
__device__ __forceinline__ void f_wgmma_64x128_rs(float* d, const unsigned int* a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : F_ACC8(0), F_ACC8(8), F_ACC8(16), F_ACC8(24), F_ACC8(32), F_ACC8(40), F_ACC8(48), F_ACC8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
}
#endif

#endif


#if F_SUPPORTED
// 2^x in one MUFU instruction (results below the smallest normal float flush to 0, which the
// softmax's probabilities lose nothing by; exp2f without fast math adds a denormal fix-up).
__device__ __forceinline__ float f_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// One key tile's online softmax for a thread's two rows (a, b): masks the raw scores s where a key
// of the tile may fall outside a row's range (causal: key <= the row's position; sliding window:
// key > position - SLIDING_WINDOW), moves the running maxima m (raw scores: the scale is
// positive) and sums l, and writes P = exp2(S * scale - max) as bf16 A fragments of P V (16 keys
// each) and the factors alpha that rescale the rows' accumulators. Returns whether a maximum of
// the warp's rows moved (else every factor is exactly 1 and the caller skips f_rescale).
__device__ __forceinline__ bool f_online_softmax(float (&s)[F_KTILES][4], unsigned int (&p)[F_KTILES / 2][4],
                                                 float& m_a, float& m_b, float& l_a, float& l_b, float& alpha_a,
                                                 float& alpha_b, int kb, int pos_a, int pos_b, int warp_first_pos,
                                                 int warp_last_pos, int pair, float log2_scale) {
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
    // Scaled into the log2 domain only inside the exponentials; a row with no key yet subtracts 0
    // (its scores are all -inf, their exponentials 0).
    const float base_a = top_a == -INFINITY ? 0.0f : top_a * log2_scale;
    const float base_b = top_b == -INFINITY ? 0.0f : top_b * log2_scale;
    alpha_a = f_exp2(fmaf(m_a, log2_scale, -base_a));
    alpha_b = f_exp2(fmaf(m_b, log2_scale, -base_b));
    const bool moved = __any_sync(0xffffffffu, top_a != m_a || top_b != m_b);
    m_a = top_a;
    m_b = top_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < F_KTILES; ++n) {
        const float p0 = f_exp2(fmaf(s[n][0], log2_scale, -base_a));
        const float p1 = f_exp2(fmaf(s[n][1], log2_scale, -base_a));
        const float p2 = f_exp2(fmaf(s[n][2], log2_scale, -base_b));
        const float p3 = f_exp2(fmaf(s[n][3], log2_scale, -base_b));
        sum_a += p0 + p1;
        sum_b += p2 + p3;
        p[n / 2][(n & 1) * 2] = pack_bf16x2(p0, p1);
        p[n / 2][(n & 1) * 2 + 1] = pack_bf16x2(p2, p3);
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    return moved;
}

// O *= alpha per row (a: fragment elements 0-1, b: 2-3).
__device__ __forceinline__ void f_rescale(float (&o)[F_DTILES][4], float alpha_a, float alpha_b) {
#pragma unroll
    for (int i = 0; i < F_DTILES; ++i) {
        o[i][0] *= alpha_a;
        o[i][1] *= alpha_a;
        o[i][2] *= alpha_b;
        o[i][3] *= alpha_b;
    }
}
#endif

// Blocks per SM the registers are budgeted for: the warpgroup kernel's shared memory fits one;
// the mma.sync path three (12 warps at up to 170 registers: left to itself ptxas took 203, two
// blocks per SM, and the bandwidth-bound decode rows of mixed steps ran slower).
#if F_WGMMA
#define F_MIN_BLOCKS 1
#else
#define F_MIN_BLOCKS 3
#endif

// The warpgroup kernel's block adds a producer warpgroup to its F_WARPS consumer warps.
#define F_WARPGROUP 128  // threads per warpgroup
#if F_WGMMA
#define F_THREADS (F_WARPS * 32 + F_WARPGROUP)
#else
#define F_THREADS (F_WARPS * 32)
#endif

extern "C" __global__ void __launch_bounds__(F_THREADS, F_MIN_BLOCKS)
prefill_attention(const bf16* __restrict__ q,
                  const kv_t* __restrict__ k_cache,
                  const kv_t* __restrict__ v_cache,
                  const float* __restrict__ kv_scales,
                  const float* __restrict__ sinks,
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
    // The last tiles first: a prompt's later tiles attend to more keys, and blocks that start
    // longest finish the launch with fewer idle SMs.
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int t0 = tiles[2 * tile];
    const int tokens = min(tiles[2 * tile + 1], F_TOKENS);
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

#if F_WGMMA
    // Warp specialisation: the last warpgroup produces, the F_WARPS warps before it consume.
    // Stage b's `full` barrier completes when the producer's copies of a tile into it have all
    // landed (each producer thread's cp.async arrives on its own); its `empty` barrier when every
    // consumer warp is done reading that tile. The producer runs up to F_STAGES tiles ahead and
    // never waits for a consumer except for a stage to come free, so the two consumer warpgroups
    // are not held in step by a block barrier per tile.
    extern __shared__ __align__(1024) unsigned char f_dynamic[];
    static_assert(F_STAGES * 2 * F_TILE_BYTES + 2 * F_Q_BYTES + 1024 <= F_SHARED, "F_SHARED too small for the stages");
    const unsigned int stage0 = (shared_address(f_dynamic) + 1023u) & ~1023u;
    __shared__ __align__(8) unsigned long long f_full[F_STAGES], f_empty[F_STAGES];
    const int consumer_warps = rows_used > 64 ? F_WARPS : 4;  // a warpgroup without rows leaves
    if (threadIdx.x == 0) {
#pragma unroll
        for (int b = 0; b < F_STAGES; ++b) {
            f_barrier_init(&f_full[b], F_WARPGROUP);
            f_barrier_init(&f_empty[b], consumer_warps);
        }
    }
    __syncthreads();
    const int num_tiles = kb_end > kb_begin ? (kb_end - kb_begin + F_KEYS - 1) / F_KEYS : 0;
    if (warp >= F_WARPS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(F_PRODUCER_REGS));
        // Each producer thread copies one 16-byte chunk of every F_PASS_KEYS-th key of a tile,
        // keys and values: its chunk, its first key and so its swizzled place in a stage are
        // fixed; zeros outside [first_pos, last_pos].
        constexpr int F_PASS_KEYS = F_WARPGROUP / F_CHUNKS;
        static_assert(F_WARPGROUP % F_CHUNKS == 0 && F_PASS_KEYS % 8 == 0 && F_KEYS % F_PASS_KEYS == 0,
                      "a pass must cover whole swizzle atoms and a tile whole passes");
        const int producer = threadIdx.x - F_WARPS * 32;
        const int my_chunk = producer % F_CHUNKS;
        const int my_key = producer / F_CHUNKS;
        const unsigned int my_at =
            (my_chunk >> 3) * F_HALF_BYTES + my_key * 128 + (((my_chunk & 7) ^ (my_key & 7)) << 4);
        const bf16* my_k = k_cache + kvh * HEAD_DIM + my_chunk * 8;
        const bf16* my_v = v_cache + kvh * HEAD_DIM + my_chunk * 8;
        for (int t = 0; t < num_tiles; ++t) {
            const int buf = t % F_STAGES;
            if (t >= F_STAGES) f_barrier_wait(&f_empty[buf], (t / F_STAGES - 1) & 1);
            const int kb = kb_begin + t * F_KEYS;
            const unsigned int k_stage = stage0 + buf * 2 * F_TILE_BYTES + my_at;
#pragma unroll 4
            for (int pass = 0; pass < F_KEYS / F_PASS_KEYS; ++pass) {
                const int j = kb + my_key + pass * F_PASS_KEYS;
                const bool valid = j >= first_pos && j <= last_pos;
                const size_t row =
                    valid ? ((size_t)table[j / KV_BLOCK] * KV_BLOCK + j % KV_BLOCK) * NUM_KV_HEADS * HEAD_DIM : 0;
                const unsigned int at = k_stage + pass * F_PASS_KEYS * 128;
                copy16_async(at, my_k + row, valid);
                copy16_async(at + F_TILE_BYTES, my_v + row, valid);
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(shared_address(&f_full[buf]))
                         : "memory");
        }
        return;  // the consumers wait for every copy before the block ends
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(F_CONSUMER_REGS));
    if ((warp >> 2) * 64 >= rows_used) return;
#endif
    // This thread's two rows of the warp's 16 (fragment rows lane / 4 and lane / 4 + 8), their
    // positions (-1: an unused row, every key masked), and the warp's first and last positions.
    const int quad = lane >> 2;
    const int pair = (lane & 3) * 2;
    const int row_a = warp * 16 + quad;
    const int row_b = row_a + 8;
    const int pos_a = row_a < rows_used ? positions[t0 + row_a / F_GROUP] : -1;
    const int pos_b = row_b < rows_used ? positions[t0 + row_b / F_GROUP] : -1;
    const int warp_last_row = min(warp * 16 + 15, rows_used - 1);
    const int warp_last_pos = warp * 16 < rows_used ? positions[t0 + warp_last_row / F_GROUP] : -1;
    const int warp_first_pos = warp * 16 < rows_used ? positions[t0 + warp * 16 / F_GROUP] : -1;

#if F_WGMMA
    // The warpgroup's 64 query rows in shared memory, in the layout of a K-major A operand (the
    // keys' layout: per 64-dimension column half, 64 rows of 128 bytes, 128-byte swizzle); zeros
    // for rows past rows_used. Read there by every S = Q K^T product, they take no registers.
    const unsigned int q_stage = stage0 + F_STAGES * 2 * F_TILE_BYTES + (warp >> 2) * F_Q_BYTES;
    {
        const int thread = threadIdx.x % F_WARPGROUP;
#pragma unroll
        for (int k = 0; k < F_CHUNKS / 2; ++k) {
            const int id = thread + F_WARPGROUP * k;
            const int row = id / F_CHUNKS;
            const int chunk = id % F_CHUNKS;
            const int r = (warp >> 2) * 64 + row;  // the block's row
            uint4 value = make_uint4(0u, 0u, 0u, 0u);
            if (r < rows_used)
                value = *reinterpret_cast<const uint4*>(
                    q + ((size_t)(t0 + r / F_GROUP) * NUM_Q_HEADS + kvh * F_GROUP + r % F_GROUP) * HEAD_DIM + chunk * 8);
            const unsigned int at = q_stage + (chunk >> 3) * (64 * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(at), "r"(value.x), "r"(value.y), "r"(value.z),
                         "r"(value.w)
                         : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // st.shared's writes, wgmma's reads
        asm volatile("bar.sync %0, 128;" ::"r"(1 + (warp >> 2)) : "memory");
    }
#else
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
#endif

    float o[F_DTILES][4];
#pragma unroll
    for (int i = 0; i < F_DTILES; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY;
    float l_a = 0.0f, l_b = 0.0f;
#if KV_FP8
    const float log2_scale = scale * kv_scales[0] * F_LOG2E;
#else
    const float log2_scale = scale * F_LOG2E;
#endif

#if F_WGMMA
    // F_STAGES stages, each the tile's keys then its values: per HEAD_DIM / 64 column half, F_KEYS
    // rows of 128 bytes, the 16-byte chunk c of row r at chunk c ^ (r % 8) (the 128-byte swizzle
    // wgmma reads), from a 1024-byte aligned base.
    //
    // Software pipeline: in iteration i a warpgroup issues S_i = Q K_i^T and then O += P_(i-1)
    // V_(i-1), waits for S_i only, and runs tile i's softmax on the CUDA cores while the tensor
    // cores finish P_(i-1) V_(i-1); O is rescaled once that product is done, and tile i - 1's
    // stage released. P alternates between two register sets (pa, pb) so that no instruction
    // writes a register an unfinished product reads: a copy of the new P into the old one's
    // registers made ptxas serialize every product of the kernel (C7513).
    auto await_tile = [&](int i) {
        f_barrier_wait(&f_full[i % F_STAGES], (i / F_STAGES) & 1);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async's writes, wgmma's reads
    };
    auto release_tile = [&](int i) {
        __syncwarp();
        if (lane == 0) f_barrier_arrive(&f_empty[i % F_STAGES]);
    };
    // S = Q K^T over tile i: per F_QK_N keys, HEAD_DIM / 16 products over 16 dimensions (K-major:
    // 32 bytes further along the swizzled rows per step, the next column half after four).
    auto products_qk = [&](float (&s)[F_KTILES][4], int i) {
        const unsigned int k_stage = stage0 + (i % F_STAGES) * 2 * F_TILE_BYTES;
        f_wgmma_fence();
#pragma unroll
        for (int j = 0; j < F_KEYS / F_QK_N; ++j) {
#pragma unroll
            for (int d = 0; d < F_DSTEPS; ++d) {
                const unsigned int at = k_stage + (d >> 2) * F_HALF_BYTES + j * F_QK_N * 128 + (d & 3) * 32;
                const unsigned long long a = f_descriptor(q_stage + (d >> 2) * (64 * 128) + (d & 3) * 32, 16, 1024);
#if F_QK_N == 128
                f_wgmma_64x128_ss(&s[j * 16][0], a, f_descriptor(at, 16, 1024), d > 0);
#else
                f_wgmma_64x64_ss(&s[j * 8][0], a, f_descriptor(at, 16, 1024), d > 0);
#endif
            }
        }
        f_wgmma_commit();
    };
    // O += P V over tile i (N-major: the values' rows are keys, 16 per product; 8-key groups 1024
    // bytes apart, 64-dimension column halves F_HALF_BYTES apart).
    auto products_pv = [&](const unsigned int (&pv)[F_KTILES / 2][4], int i) {
        const unsigned int v_stage = stage0 + (i % F_STAGES) * 2 * F_TILE_BYTES + F_TILE_BYTES;
#pragma unroll
        for (int k = 0; k < F_KEYS / 16; ++k) {
            const unsigned int at = v_stage + k * 16 * 128;
#if HEAD_DIM == 128
            f_wgmma_64x128_rs(&o[0][0], pv[k], f_descriptor(at, F_HALF_BYTES, 1024));
#else
            f_wgmma_64x64_rs(&o[0][0], pv[k], f_descriptor(at, 1024, 1024));
#endif
        }
        f_wgmma_commit();
    };
    // Waits for every product; O and the P it read may be touched again.
    auto finish_pv = [&](unsigned int (&pv)[F_KTILES / 2][4]) {
        f_wgmma_wait();
        f_fence_operands<F_DTILES * 4>(&o[0][0]);
        f_fence_registers<F_KTILES * 2>(&pv[0][0]);
    };
    // Iteration i >= 1: P_(i-1) in `prev`, tile i's P into `next`.
    auto iteration = [&](int i, unsigned int (&prev)[F_KTILES / 2][4], unsigned int (&next)[F_KTILES / 2][4]) {
        const int kb = kb_begin + i * F_KEYS;
        float s[F_KTILES][4];
        await_tile(i);
        products_qk(s, i);
        products_pv(prev, i - 1);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // S only
        f_fence_operands<F_KTILES * 4>(&s[0][0]);
        float alpha_a, alpha_b;
        const bool moved = f_online_softmax(s, next, m_a, m_b, l_a, l_b, alpha_a, alpha_b, kb, pos_a, pos_b,
                                            warp_first_pos, warp_last_pos, pair, log2_scale);
        // A branch on the sums the softmax ends with (never taken: sums are not negative) keeps
        // ptxas from scheduling the wait below ahead of the softmax, which would leave nothing to
        // overlap with P V.
        if (l_a + l_b < 0.0f) asm volatile("nanosleep.u32 0;");
        finish_pv(prev);
        release_tile(i - 1);
        if (moved) f_rescale(o, alpha_a, alpha_b);
    };

    unsigned int pa[F_KTILES / 2][4], pb[F_KTILES / 2][4];
    if (num_tiles > 0) {
        float s[F_KTILES][4];
        await_tile(0);
        products_qk(s, 0);
        f_wgmma_wait();
        f_fence_operands<F_KTILES * 4>(&s[0][0]);
        float alpha_a, alpha_b;
        f_online_softmax(s, pa, m_a, m_b, l_a, l_b, alpha_a, alpha_b, kb_begin, pos_a, pos_b, warp_first_pos,
                         warp_last_pos, pair, log2_scale);
        int i = 1;
        for (; i + 1 < num_tiles; i += 2) {
            iteration(i, pa, pb);
            iteration(i + 1, pb, pa);
        }
        // The last tile's P V, from whichever set holds it (each branch names its set, so both
        // stay in registers).
        auto last_pv = [&](unsigned int (&last)[F_KTILES / 2][4]) {
            f_wgmma_fence();
            products_pv(last, num_tiles - 1);
            finish_pv(last);
        };
        if (i < num_tiles) {
            iteration(i, pa, pb);
            last_pv(pb);
        } else {
            last_pv(pa);
        }
    }
#else
    // Two stages of keys and values: the next tile is copied while this one is used.
    __shared__ __align__(16) bf16 ks[2][F_KEYS * F_STRIDE];
    __shared__ __align__(16) bf16 vs[2][F_KEYS * F_STRIDE];

    // ldmatrix row addresses of this thread: matrix lane / 8, row lane % 8.
    const int mat = lane >> 3;
    const int mrow = lane & 7;
    const unsigned int ks_stage0 = shared_address(ks[0]);
    const unsigned int vs_stage0 = shared_address(vs[0]);
    const unsigned int stage_bytes = F_KEYS * F_STRIDE * 2;

    // Starts copying the keys and values of the tile at key `kb` into stage `buf` (zeros outside
    // [first_pos, last_pos]).
#if KV_FP8
    // The same for an FP8 cache: every load of the thread's chunks is issued first, then each is
    // widened to bf16 and stored where the copy would put it (one memory latency per tile).
    auto stage = [&](int kb, int buf) {
        constexpr int F_PER_THREAD = (F_KEYS * F_CHUNKS + F_WARPS * 32 - 1) / (F_WARPS * 32);
        uint2 kb8[F_PER_THREAD], vb8[F_PER_THREAD];
#pragma unroll
        for (int r = 0; r < F_PER_THREAD; ++r) {
            const int i = threadIdx.x + r * F_WARPS * 32;
            const int j = kb + i / F_CHUNKS;
            kb8[r] = vb8[r] = make_uint2(0u, 0u);
            if (i < F_KEYS * F_CHUNKS && j >= first_pos && j <= last_pos) {
                const size_t slot = (size_t)table[j / KV_BLOCK] * KV_BLOCK + j % KV_BLOCK;
                const size_t offset = (slot * NUM_KV_HEADS + kvh) * HEAD_DIM + (i % F_CHUNKS) * 8;
                kb8[r] = __ldg(reinterpret_cast<const uint2*>(k_cache + offset));
                vb8[r] = __ldg(reinterpret_cast<const uint2*>(v_cache + offset));
            }
        }
#pragma unroll
        for (int r = 0; r < F_PER_THREAD; ++r) {
            const int i = threadIdx.x + r * F_WARPS * 32;
            if (i >= F_KEYS * F_CHUNKS) continue;
            const unsigned int at = 2 * ((i / F_CHUNKS) * F_STRIDE + (i % F_CHUNKS) * 8);
            const uint4 kx = bf16x8_from_e4m3x8(kb8[r]);
            const uint4 vx = bf16x8_from_e4m3x8(vb8[r]);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(ks_stage0 + buf * stage_bytes + at),
                         "r"(kx.x), "r"(kx.y), "r"(kx.z), "r"(kx.w)
                         : "memory");
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(vs_stage0 + buf * stage_bytes + at),
                         "r"(vx.x), "r"(vx.y), "r"(vx.z), "r"(vx.w)
                         : "memory");
        }
    };
#else
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
            copy16_async(ks_stage0 + buf * stage_bytes + at, k_cache + offset, valid);
            copy16_async(vs_stage0 + buf * stage_bytes + at, v_cache + offset, valid);
        }
        asm volatile("cp.async.commit_group;");
    };
#endif

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
                ldmatrix_x4(k_stage + 2 * (key * F_STRIDE + d * 16 + (mat & 1) * 8), b);
                mma_bf16(s[n], qa[d], b[0], b[1]);
                mma_bf16(s[n + 1], qa[d], b[2], b[3]);
            }
        }

        unsigned int p[F_KTILES / 2][4];
        float alpha_a, alpha_b;
        if (f_online_softmax(s, p, m_a, m_b, l_a, l_b, alpha_a, alpha_b, kb, pos_a, pos_b, warp_first_pos,
                             warp_last_pos, pair, log2_scale)) {
            f_rescale(o, alpha_a, alpha_b);
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
#endif

#if KV_FP8
    f_rescale(o, kv_scales[1], kv_scales[1]);
#endif
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
            const float sum = sink_total(l, (half ? m_b : m_a) * log2_scale, sinks, kvh * F_GROUP + row % F_GROUP);
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
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
