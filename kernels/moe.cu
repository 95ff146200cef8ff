// The mixture-of-experts MLP (docs/engine.md, "The MoE path"). Compiled after kernels/gemv.cu
// and kernels/fp8.cu (whose entry points it leaves out, GEMV_NO_ENTRIES and FP8_NO_ENTRIES) so
// the grouped products reuse their small-M inner loops and E4M3 conversions; kernels/moe_fp8.cu
// (FP8 experts) follows it. kernels/gpt_oss.cu's family compiles it too, for the permutation and
// the tensor-core tile, without its entry points (MOE_NO_ENTRIES). The host defines, beside the model's shapes (src/backend/cuda/kernels.rs):
//   MOE_EXPERTS       experts per layer (at most 512);
//   MOE_TOP_K         experts per token (at most 16);
//   MOE_RENORMALIZE   1: the chosen weights are divided by their sum (norm_topk_prob, Mixtral);
//   MOE_LOGITS        the router product's row width: MOE_EXPERTS, plus one where the shared
//                     expert's gate is stacked under the router (its logit is the last column);
//   MOE_INTER         each expert's width (a multiple of 16);
//   MOE_SHARED_INTER  the shared expert's width, 0 without one.
//
// A step of T tokens runs, after the router's product (logits [T, MOE_LOGITS] fp32):
//   moe_route          per token, one warp: softmax over the experts' logits in fp32, the top k
//                      by k rounds of a warp arg-max (ties: lower index), weights renormalised as
//                      declared. When the k-th probability ties with the first one left out, the
//                      warp's first lane chooses as torch.topk does on the CPU instead (libstdc++'s
//                      heap selection or introselect over (probability, expert) pairs, ported from
//                      src/backend/cpu/topk.rs), so the choice is the CPU reference's;
//   moe_permute        one block: tokens grouped by expert on the device: a count per expert, a
//                      scan, each (token, slot) scattered into its expert's segment. `meta` holds
//                      the segment offsets [MOE_EXPERTS + 1], the number of experts with rows and
//                      their list; `sorted_tokens` each permuted row's token, `row_of` each (token,
//                      slot)'s permuted row. Every size stays on the device;
//   moe_gather         the permuted rows of x, [T * MOE_TOP_K, HIDDEN] bf16;
//   moe_route_permute  the three above in one block, for steps of few tokens (decode); for one
//                      token nothing is gathered (every slot's row is x's one row);
//   moe_gate_up        grid (MOE_INTER / pairs, active experts): expert j's segment against its
//                      gate/up slice (x_perm's rows x_stride apart: HIDDEN, or 0 to read x's one
//                      row in place), SwiGLU applied, [rows, MOE_INTER] bf16; rows in chunks of 8
//                      through gemv.cu's small-M loops (tensor cores where the device has them),
//                      so only the experts with rows are read;
//   moe_down           grid (HIDDEN / rows, active experts): the same for the down projection,
//                      [rows, HIDDEN] fp32;
//   moe_gemm_gate_up,  the same two products for many rows per expert (prefill), on tensor cores:
//   moe_gemm_down      64-row tiles of each expert's segment by 64 columns (a tile list from the
//                      permutation), so an expert's weights are read once per 64 rows;
//   moe_down_combine_one  for a step of one token (decode at batch 1), the down product and the
//                      combine below in one: a block per 4 output columns, a warp per slot;
//   moe_shared_swiglu  SwiGLU of the shared expert's gate/up product (Qwen2-MoE);
//   moe_combine        per token, the routing-weighted sum of its permuted rows (slot order) plus
//                      the shared expert's output scaled by the sigmoid of its gate, into `delta`
//                      (which the next norm adds to the residual stream).
// Buffers are sized for the step limits, so a step can be captured in a CUDA graph: the number of
// active experts only decides which blocks return at once.

#define MOE_PER_LANE ((MOE_EXPERTS + 31) / 32)
#define MOE_ROUTE_WARPS 4
#define MOE_CHUNK 8
// meta: [0, MOE_EXPERTS] segment offsets, [MOE_EXPERTS + 1] experts with rows, then their list
// [MOE_EXPERTS], then each expert's first row tile of the grouped GEMM [MOE_EXPERTS + 1] (the last:
// the step's count of tiles).
#define MOE_META_COUNT (MOE_EXPERTS + 1)
#define MOE_META_ACTIVE (MOE_EXPERTS + 2)
#define MOE_META_TILES (2 * MOE_EXPERTS + 2)
#define MOE_META_WORDS (3 * MOE_EXPERTS + 3)
// The grouped GEMM's tile: 64 permuted rows of one expert by 64 output columns, K in steps of 32.
#define MOE_BM 64
#define MOE_BN 64
#define MOE_BK 32
// Shared-memory row stride of a tile, in bf16 values (80 bytes: ldmatrix rows hit distinct banks).
#define MOE_LDS 40

// A probability and its expert, as torch.topk's CPU kernel sorts them.
struct MoePair {
    float v;
    int i;
};

// torch's order for the largest values: NaN first, then greater values; equal values are
// unordered (which one leads is the algorithm's doing, not the index's).
__device__ __forceinline__ bool moe_before(const MoePair& a, const MoePair& b) {
    const bool a_nan = a.v != a.v;
    const bool b_nan = b.v != b.v;
    return (a_nan && !b_nan) || a.v > b.v;
}

// libstdc++'s __push_heap.
__device__ void moe_push_hole(MoePair* heap, int hole, int top, MoePair value) {
    while (hole > top) {
        const int parent = (hole - 1) / 2;
        if (!moe_before(heap[parent], value)) break;
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = value;
}

// libstdc++'s __adjust_heap over the first `len` pairs.
__device__ void moe_adjust_heap(MoePair* heap, int hole, int len, MoePair value) {
    const int top = hole;
    int child = hole;
    const int inner = len > 0 ? (len - 1) / 2 : 0;
    while (child < inner) {
        child = 2 * (child + 1);
        if (moe_before(heap[child], heap[child - 1])) child -= 1;
        heap[hole] = heap[child];
        hole = child;
    }
    if (len % 2 == 0 && len >= 2 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        heap[hole] = heap[child - 1];
        hole = child - 1;
    }
    moe_push_hole(heap, hole, top, value);
}

__device__ void moe_make_heap(MoePair* heap, int len) {
    if (len < 2) return;
    for (int parent = (len - 2) / 2;; --parent) {
        moe_adjust_heap(heap, parent, len, heap[parent]);
        if (parent == 0) return;
    }
}

// libstdc++'s __pop_heap: the front into `result`, the rest of the first `len` re-heaped.
__device__ void moe_pop_heap_into(MoePair* heap, int len, int result) {
    const MoePair value = heap[result];
    heap[result] = heap[0];
    moe_adjust_heap(heap, 0, len, value);
}

__device__ void moe_sort_heap(MoePair* heap, int len) {
    for (; len > 1; --len) moe_pop_heap_into(heap, len - 1, len - 1);
}

// libstdc++'s __heap_select: the `middle` leading pairs in a heap at the front.
__device__ void moe_heap_select(MoePair* q, int len, int middle) {
    moe_make_heap(q, middle);
    for (int i = middle; i < len; ++i) {
        if (moe_before(q[i], q[0])) moe_pop_heap_into(q, middle, i);
    }
}

__device__ __forceinline__ void moe_swap(MoePair* q, int a, int b) {
    const MoePair t = q[a];
    q[a] = q[b];
    q[b] = t;
}

// Median of the second, middle and last pairs to the front, then libstdc++'s unguarded partition.
__device__ int moe_partition_pivot(MoePair* q, int len) {
    const int a = 1, b = len / 2, c = len - 1;
    int median;
    if (moe_before(q[a], q[b])) {
        median = moe_before(q[b], q[c]) ? b : (moe_before(q[a], q[c]) ? c : a);
    } else {
        median = moe_before(q[a], q[c]) ? a : (moe_before(q[b], q[c]) ? c : b);
    }
    moe_swap(q, 0, median);
    int first = 1, last = len;
    for (;;) {
        while (moe_before(q[first], q[0])) ++first;
        --last;
        while (moe_before(q[0], q[last])) --last;
        if (first >= last) return first;
        moe_swap(q, first, last);
        ++first;
    }
}

// libstdc++'s insertion sort.
__device__ void moe_insertion_sort(MoePair* q, int len) {
    for (int i = 1; i < len; ++i) {
        const MoePair value = q[i];
        if (moe_before(value, q[0])) {
            for (int j = i; j > 0; --j) q[j] = q[j - 1];
            q[0] = value;
        } else {
            int hole = i;
            while (moe_before(value, q[hole - 1])) {
                q[hole] = q[hole - 1];
                --hole;
            }
            q[hole] = value;
        }
    }
}

// libstdc++'s introselect.
__device__ void moe_nth_element(MoePair* q, int len, int nth) {
    int first = 0, last = len;
    if (first == last || nth == last) return;
    int depth = 2 * (31 - __clz(last));
    while (last - first > 3) {
        if (depth == 0) {
            moe_heap_select(q + first, last - first, nth + 1 - first);
            moe_swap(q, first, nth);
            return;
        }
        --depth;
        const int cut = first + moe_partition_pivot(q + first, last - first);
        if (cut <= nth) {
            first = cut;
        } else {
            last = cut;
        }
    }
    moe_insertion_sort(q + first, last - first);
}

// torch.topk(values, k) on the CPU (sorted): the k leading pairs of `q` (n of them) end up in
// q[0..k), in torch's order (src/backend/cpu/topk.rs).
__device__ void moe_torch_topk(MoePair* q, int n, int k) {
    if (k * 64 <= n) {
        moe_heap_select(q, n, k);
        moe_sort_heap(q, k);
    } else {
        moe_nth_element(q, n, k - 1);
        moe_insertion_sort(q, k - 1);
    }
}

// Routes token t with the calling warp (`scratch`: the warp's MOE_EXPERTS pairs of shared
// memory, for a tie).
__device__ void moe_route_token(int t,
                                const float* __restrict__ logits,
                                const int* __restrict__ tokens,
                                int* __restrict__ topk_ids,
                                float* __restrict__ topk_weights,
                                MoePair* scratch) {
    const int lane = threadIdx.x & 31;
    const float* row = logits + (size_t)t * MOE_LOGITS;
    float p[MOE_PER_LANE];
    float top = -INFINITY;
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        p[j] = e < MOE_EXPERTS ? row[e] : -INFINITY;
        top = fmaxf(top, p[j]);
    }
    top = warp_max(top);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        p[j] = e < MOE_EXPERTS ? expf(p[j] - top) : 0.0f;
        sum += p[j];
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        // Past the experts: below any probability, never chosen.
        p[j] = e < MOE_EXPERTS ? p[j] / sum : -1.0f;
    }
    int chosen[MOE_TOP_K];
    float weight[MOE_TOP_K];
    unsigned int taken = 0;
    bool tie = false;
    // k rounds of arg-max, and one more for the first expert left out (a tie at the boundary).
#pragma unroll
    for (int s = 0; s <= MOE_TOP_K; ++s) {
        if (s == MOE_TOP_K && MOE_TOP_K >= MOE_EXPERTS) break;
        float best = -2.0f;
        int best_e = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < MOE_PER_LANE; ++j) {
            if (!((taken >> j) & 1u) && p[j] > best) {
                best = p[j];
                best_e = lane + 32 * j;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, o);
            const int other_e = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (other > best || (other == best && other_e < best_e)) {
                best = other;
                best_e = other_e;
            }
        }
        if (s < MOE_TOP_K) {
            chosen[s] = best_e;
            weight[s] = best;
            if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
        } else {
            tie = best == weight[MOE_TOP_K - 1];
        }
    }
    // A padding token (negative id) keeps the lower index: its output is never read.
    tie = tie && tokens[t] >= 0;
    if (tie) {
#pragma unroll
        for (int j = 0; j < MOE_PER_LANE; ++j) {
            const int e = lane + 32 * j;
            if (e < MOE_EXPERTS) scratch[e] = MoePair{p[j], e};
        }
        __syncwarp();
    }
    if (lane == 0) {
        if (tie) {
            moe_torch_topk(scratch, MOE_EXPERTS, MOE_TOP_K);
#pragma unroll
            for (int s = 0; s < MOE_TOP_K; ++s) {
                chosen[s] = scratch[s].i;
                weight[s] = scratch[s].v;
            }
        }
        float total = 0.0f;
#pragma unroll
        for (int s = 0; s < MOE_TOP_K; ++s) total += weight[s];
#pragma unroll
        for (int s = 0; s < MOE_TOP_K; ++s) {
            topk_ids[t * MOE_TOP_K + s] = chosen[s];
            topk_weights[t * MOE_TOP_K + s] = MOE_RENORMALIZE ? weight[s] / total : weight[s];
        }
    }
    __syncwarp();
}

// Routes tokens [0, count) with the block's warps (a grid of blocks takes them in turn).
__device__ void moe_route_tokens(const float* __restrict__ logits,
                                 const int* __restrict__ tokens,
                                 int* __restrict__ topk_ids,
                                 float* __restrict__ topk_weights,
                                 int count,
                                 MoePair (&scratch)[MOE_ROUTE_WARPS][MOE_EXPERTS]) {
    const int warp = threadIdx.x >> 5;
    for (int t = blockIdx.x * MOE_ROUTE_WARPS + warp; t < count; t += gridDim.x * MOE_ROUTE_WARPS) {
        moe_route_token(t, logits, tokens, topk_ids, topk_weights, scratch[warp]);
    }
}

// The permutation of `entries` (token, slot) pairs by the whole block (one block).
__device__ void moe_permute_block(const int* __restrict__ topk_ids,
                                  int* __restrict__ meta,
                                  int* __restrict__ sorted_tokens,
                                  int* __restrict__ row_of,
                                  int entries) {
    __shared__ int counts[MOE_EXPERTS];
    __shared__ int cursor[MOE_EXPERTS];
    for (int e = threadIdx.x; e < MOE_EXPERTS; e += blockDim.x) counts[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < entries; i += blockDim.x) atomicAdd(&counts[topk_ids[i]], 1);
    __syncthreads();
    if (threadIdx.x < 32) {
        // Lane l scans experts [l * MOE_PER_LANE, (l + 1) * MOE_PER_LANE).
        const int lane = threadIdx.x;
        const int first = lane * MOE_PER_LANE;
        int rows = 0, active = 0, tiles = 0;
        for (int e = first; e < min(first + MOE_PER_LANE, MOE_EXPERTS); ++e) {
            rows += counts[e];
            active += counts[e] > 0;
            tiles += (counts[e] + MOE_BM - 1) / MOE_BM;
        }
        int rows_before = rows, active_before = active, tiles_before = tiles;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int r = __shfl_up_sync(0xffffffffu, rows_before, o);
            const int a = __shfl_up_sync(0xffffffffu, active_before, o);
            const int m = __shfl_up_sync(0xffffffffu, tiles_before, o);
            if (lane >= o) {
                rows_before += r;
                active_before += a;
                tiles_before += m;
            }
        }
        rows_before -= rows;
        active_before -= active;
        tiles_before -= tiles;
        for (int e = first; e < min(first + MOE_PER_LANE, MOE_EXPERTS); ++e) {
            meta[e] = rows_before;
            meta[MOE_META_TILES + e] = tiles_before;
            cursor[e] = rows_before;
            if (counts[e] > 0) meta[MOE_META_ACTIVE + active_before++] = e;
            rows_before += counts[e];
            tiles_before += (counts[e] + MOE_BM - 1) / MOE_BM;
        }
        if (lane == 31) {
            meta[MOE_EXPERTS] = rows_before;
            meta[MOE_META_COUNT] = active_before;
            meta[MOE_META_TILES + MOE_EXPERTS] = tiles_before;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < entries; i += blockDim.x) {
        const int r = atomicAdd(&cursor[topk_ids[i]], 1);
        sorted_tokens[r] = i / MOE_TOP_K;
        row_of[i] = r;
    }
}

// Permuted rows [first, entries) of x, every `step`-th, copied by the block.
__device__ void moe_gather_rows(const bf16* __restrict__ x,
                                const int* __restrict__ sorted_tokens,
                                bf16* __restrict__ x_perm,
                                int first,
                                int step,
                                int entries) {
    for (int r = first; r < entries; r += step) {
        const uint4* src = reinterpret_cast<const uint4*>(x + (size_t)sorted_tokens[r] * HIDDEN);
        uint4* dst = reinterpret_cast<uint4*>(x_perm + (size_t)r * HIDDEN);
        for (int i = threadIdx.x; i < HIDDEN / 8; i += blockDim.x) dst[i] = src[i];
    }
}

#ifndef MOE_NO_ENTRIES
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_WARPS * 32)
    moe_route(const float* __restrict__ logits, const int* __restrict__ tokens, int* __restrict__ topk_ids,
              float* __restrict__ topk_weights, int count) {
    __shared__ MoePair scratch[MOE_ROUTE_WARPS][MOE_EXPERTS];
    await_previous_kernels();
    moe_route_tokens(logits, tokens, topk_ids, topk_weights, count, scratch);
}

extern "C" __global__ void __launch_bounds__(1024)
    moe_permute(const int* __restrict__ topk_ids, int* __restrict__ meta, int* __restrict__ sorted_tokens,
                int* __restrict__ row_of, int count) {
    await_previous_kernels();
    moe_permute_block(topk_ids, meta, sorted_tokens, row_of, count * MOE_TOP_K);
}

extern "C" __global__ void moe_gather(const bf16* __restrict__ x, const int* __restrict__ sorted_tokens,
                                      bf16* __restrict__ x_perm, int count) {
    await_previous_kernels();
    moe_gather_rows(x, sorted_tokens, x_perm, blockIdx.x, gridDim.x, count * MOE_TOP_K);
}

extern "C" __global__ void __launch_bounds__(MOE_ROUTE_WARPS * 32)
    moe_route_permute(const float* __restrict__ logits, const int* __restrict__ tokens, int* __restrict__ topk_ids,
                      float* __restrict__ topk_weights, int* __restrict__ meta, int* __restrict__ sorted_tokens,
                      int* __restrict__ row_of, const bf16* __restrict__ x, bf16* __restrict__ x_perm, int count) {
    __shared__ MoePair scratch[MOE_ROUTE_WARPS][MOE_EXPERTS];
    await_previous_kernels();
    moe_route_tokens(logits, tokens, topk_ids, topk_weights, count, scratch);
    __syncthreads();
    moe_permute_block(topk_ids, meta, sorted_tokens, row_of, count * MOE_TOP_K);
    // One token: every slot's row is x's only row, which moe_gate_up then reads in place (row
    // stride 0); nothing is gathered.
    if (count == 1) return;
    __syncthreads();
    moe_gather_rows(x, sorted_tokens, x_perm, 0, 1, count * MOE_TOP_K);
}
#endif

// `m` permuted rows of x (at `x`, HIDDEN wide) against one expert's gate/up slice `w`
// ([2 * MOE_INTER, HIDDEN], gate rows first), SwiGLU applied: the block's pairs of out's columns.
template <int M>
__device__ __forceinline__ void moe_swiglu_rows(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                bf16* __restrict__ out) {
    constexpr int ROWS = GemvShape<M>::rows;
    constexpr int PAIRS = GemvShape<M>::pairs;
    __shared__ float partial[GemvShape<M>::warps][M][ROWS];
    const int i0 = blockIdx.x * PAIRS;
    gemv_partials<M>(x, GemvRows{w, i0, MOE_INTER, PAIRS, 0x7fffffff}, HIDDEN, partial);
    for (int j = threadIdx.x; j < M * PAIRS; j += blockDim.x) {
        const int m = j / PAIRS;
        const int p = j % PAIRS;
        const float gate = gemv_total<M>(partial, m, p);
        const float up = gemv_total<M>(partial, m, p + PAIRS);
        out[(size_t)m * MOE_INTER + i0 + p] = f32_to_bf16(silu_times(gate, up));
    }
}

// The segment [begin, end) of the permuted rows in chunks of up to MOE_CHUNK rows, each by the
// small-M loop of its row count: `run(chunk_rows, first_row)`.
#define MOE_CHUNKS(CALL)                                              \
    for (int r = begin; r < end; r += MOE_CHUNK) {                    \
        switch (min(MOE_CHUNK, end - r)) {                            \
            case 1: CALL(1); break;                                   \
            case 2: CALL(2); break;                                   \
            case 3: CALL(3); break;                                   \
            case 4: CALL(4); break;                                   \
            case 5: CALL(5); break;                                   \
            case 6: CALL(6); break;                                   \
            case 7: CALL(7); break;                                   \
            default: CALL(8); break;                                  \
        }                                                             \
        __syncthreads();                                              \
    }

#ifndef MOE_NO_ENTRIES
extern "C" __global__ void __launch_bounds__(GemvShape<1>::warps * 32)
    moe_gate_up(const bf16* __restrict__ x_perm, const bf16* __restrict__ w, const int* __restrict__ meta,
                bf16* __restrict__ h_perm, int x_stride) {
    await_previous_kernels();
    if ((int)blockIdx.y >= meta[MOE_META_COUNT]) return;
    const int e = meta[MOE_META_ACTIVE + blockIdx.y];
    const int begin = meta[e];
    const int end = meta[e + 1];
    const bf16* we = w + (size_t)e * 2 * MOE_INTER * HIDDEN;
#define MOE_GATE_UP(M) moe_swiglu_rows<M>(x_perm + (size_t)r * x_stride, we, h_perm + (size_t)r * MOE_INTER)
    MOE_CHUNKS(MOE_GATE_UP)
#undef MOE_GATE_UP
}

extern "C" __global__ void __launch_bounds__(GemvShape<1>::warps * 32)
    moe_down(const bf16* __restrict__ h_perm, const bf16* __restrict__ w, const int* __restrict__ meta,
             float* __restrict__ y_perm) {
    await_previous_kernels();
    if ((int)blockIdx.y >= meta[MOE_META_COUNT]) return;
    const int e = meta[MOE_META_ACTIVE + blockIdx.y];
    const int begin = meta[e];
    const int end = meta[e + 1];
    const bf16* we = w + (size_t)e * HIDDEN * MOE_INTER;
#define MOE_DOWN(M) gemv_plain<M>(h_perm + (size_t)r * MOE_INTER, we, y_perm + (size_t)r * HIDDEN, HIDDEN, MOE_INTER)
    MOE_CHUNKS(MOE_DOWN)
#undef MOE_DOWN
}
#endif

// Eight E4M3 codes (the low byte first) widened, times `scale`, rounded to bf16 (as
// fp8_dequantize_weight rounds them), packed in a 16-byte word.
__device__ __forceinline__ uint4 moe_widen8(uint2 codes, float scale) {
    const unsigned int words[2] = {codes.x, codes.y};
    unsigned int packed[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        float a, b, c, d;
        e4m3x2_to_f32(words[j], a, b);
        e4m3x2_to_f32(words[j] >> 16, c, d);
        packed[2 * j] = (unsigned int)f32_to_bf16(a * scale) | ((unsigned int)f32_to_bf16(b * scale) << 16);
        packed[2 * j + 1] = (unsigned int)f32_to_bf16(c * scale) | ((unsigned int)f32_to_bf16(d * scale) << 16);
    }
    return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// The value of E2M1 code `c` (MXFP4's element: sign bit 3, exponent bits 2-1, mantissa bit 0;
// exponent 0 is subnormal: 0 or 0.5), built as float bits.
__device__ __forceinline__ float mx_e2m1(unsigned int c) {
    const unsigned int e = (c >> 1) & 3u;
    const unsigned int m = c & 1u;
    const unsigned int bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | ((c & 8u) << 28));
}

// The value of E8M0 scale byte `s` (MXFP4's scale), 2^(s - 127) (0x00: the subnormal 2^-127;
// 0xFF, NaN, is refused by the host at load).
__device__ __forceinline__ float mx_e8m0(unsigned int s) {
    return s ? __uint_as_float(s << 23) : __uint_as_float(0x00400000u);
}

// Eight MXFP4 codes (4 bytes, the low nibble the even element) widened, times `scale`, in bf16
// (exact: an E2M1 value times a power of two), packed in a 16-byte word.
__device__ __forceinline__ uint4 moe_widen8_mxfp4(unsigned int codes, float scale) {
    unsigned int packed[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const unsigned int byte = codes >> (8 * j);
        packed[j] = (unsigned int)f32_to_bf16(mx_e2m1(byte & 15u) * scale) |
                    ((unsigned int)f32_to_bf16(mx_e2m1((byte >> 4) & 15u) * scale) << 16);
    }
    return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// gpt-oss's clamped SwiGLU of a gate/up pair with their biases (bias[0] the gate's, bias[1] the
// up's): (clamp(up, +-limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit) (the decode
// path's arithmetic, kernels/gpt_oss.cu). Only the gpt-oss family defines GPTOSS_LIMIT.
__device__ __forceinline__ float moe_gptoss_glu(float gate, float up, const bf16* bias) {
#ifdef GPTOSS_LIMIT
    gate = fminf(gate + bf16_to_f32(bias[0]), GPTOSS_LIMIT);
    up = fminf(fmaxf(up + bf16_to_f32(bias[1]), -GPTOSS_LIMIT), GPTOSS_LIMIT);
    const float glu = gate * (1.0f / (1.0f + expf(-(gate * GPTOSS_ALPHA))));
    return (up + 1.0f) * glu;
#else
    return silu_times(gate, up);
#endif
}

// The weights' formats of the grouped GEMM's B operand (MoeTileWeights::w).
#define MOE_B_BF16 0
#define MOE_B_FP8 1
#define MOE_B_MXFP4 2

// One projection of every expert as the grouped GEMM reads it ([experts, rows, k]).
struct MoeTileWeights {
    // bf16 values, E4M3 codes or MXFP4 blocks (k / 2 bytes a row).
    const void* w;
    // FP8: f32 scales [rows, groups] of `group` columns; MXFP4: E8M0 bytes [rows, k / 32].
    const void* scales;
    int groups;
    int group;
    // gpt-oss: each row's bias [experts, rows] bf16 (null: none).
    const bf16* bias;
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// The grouped GEMM for many rows per expert (prefill): block (x, y) takes row tile y of the step's
// tiles (found from the experts' first tiles in `meta`: expert e's segment split into 64-row tiles)
// and 64 output columns: for the gate/up product (SWIGLU) 32 gate columns from x * 32 and the
// matching 32 up columns, SwiGLU applied in registers, 32 bf16 columns out; for the down product,
// 64 fp32 columns from x * 64. Four warps, 2 x 2, each 32 rows by 32 columns (2 x 4 mma.sync
// m16n8k16 tiles: for SWIGLU its 16 gate columns and their 16 up columns); A (the permuted rows)
// and B (the expert's weight rows, [N, K] row-major: the col-major B operand) go through two
// shared-memory stages (rows past the segment, columns past N and K past its end are zero-filled)
// and into registers with ldmatrix. K must be a multiple of 8; A's rows are `x_stride` values
// apart. B is read as FORMAT says:
//   MOE_B_BF16   bf16 rows, by cp.async (gate/up: the gate rows, then the up rows);
//   MOE_B_FP8    E4M3 rows (kernels/moe_fp8.cu's layout: gate/up rows in groups of 4, gate 2i,
//                2i + 1 then up 2i, 2i + 1) with f32 scales: 8 values by one 8-byte load,
//                widened, scaled and rounded to bf16 as fp8_dequantize_weight does, stored to
//                shared memory directly (the bf16 tile of the dequantized weights; K a multiple
//                of 16);
//   MOE_B_MXFP4  MXFP4 rows (blocks and E8M0 scales per 32 values; K a multiple of 32): 8 values
//                by one 4-byte load, widened exactly to bf16 the same way.
// GPTOSS (kernels/gpt_oss.cu): the gate/up rows interleave (gate 2i, up 2i + 1), each row's bias
// is added, and the gate/up epilogue is gpt-oss's clamped SwiGLU.
template <bool SWIGLU, int FORMAT, bool GPTOSS>
__device__ __forceinline__ void moe_gemm_tile(const bf16* __restrict__ x, int x_stride, MoeTileWeights wt,
                                              const int* __restrict__ meta, void* __restrict__ out, int n_out,
                                              int k) {
    __shared__ __align__(16) bf16 a_tile[2][MOE_BM * MOE_LDS];
    __shared__ __align__(16) bf16 b_tile[2][MOE_BN * MOE_LDS];
    __shared__ int tile_expert;
    const int tile = blockIdx.y;
    if (tile >= meta[MOE_META_TILES + MOE_EXPERTS]) return;
    if (threadIdx.x == 0) {
        // The expert whose tiles hold this one: the last e with first tile <= tile.
        int lo = 0, hi = MOE_EXPERTS - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (meta[MOE_META_TILES + mid] <= tile) lo = mid; else hi = mid - 1;
        }
        tile_expert = lo;
    }
    __syncthreads();
    const int e = tile_expert;
    const int row0 = meta[e] + (tile - meta[MOE_META_TILES + e]) * MOE_BM;
    const int row_end = meta[e + 1];
    // Output columns of this block: SWIGLU, local column c < 32 is output column col0 + c's gate
    // row, from 32 column col0 + c - 32's up row; otherwise local column c is row col0 + c.
    const int col0 = SWIGLU ? blockIdx.x * (MOE_BN / 2) : blockIdx.x * MOE_BN;
    const int expert_rows = SWIGLU ? 2 * n_out : n_out;
    const size_t first_row = (size_t)e * expert_rows;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    // The two 16-byte pieces each thread copies per operand per stage: piece p = tid + 128 i is
    // row p / 4, columns (p % 4) * 8. The activations and bf16 weights go to shared memory by
    // cp.async; FP8 and MXFP4 weights must be widened on the way, so their codes and scales for
    // the next stage are loaded into registers (`QuantizedPieces`) before this stage's products and
    // widened into shared memory after them: their load latency hides behind the products
    // instead of stalling every stage.
    struct QuantizedPieces {
        uint2 codes[2];
        float scale[2];
        bool in[2];
    };
    // Piece i's weight row and first column, and whether it lies inside the matrix.
    const auto b_piece = [&](int i, int k0, size_t& w_row, int& kc) {
        const int p = threadIdx.x + 128 * i;
        const int r = p >> 2, c = (p & 3) * 8;
        // The output column of local column r, and its weight row.
        const int col = SWIGLU ? col0 + (r & (MOE_BN / 2 - 1)) : col0 + r;
        const int up_half = SWIGLU && r >= MOE_BN / 2;
        const bool b_in = k0 + c < k && col < n_out;
        int n = up_half ? n_out + col : col;
        if (GPTOSS && SWIGLU) n = 2 * col + up_half;
        if (!GPTOSS && SWIGLU && FORMAT == MOE_B_FP8) n = 4 * (col >> 1) + (col & 1) + 2 * up_half;
        w_row = first_row + (b_in ? n : 0);
        kc = b_in ? k0 + c : 0;
        return b_in;
    };
    const auto load_async = [&](int stage, int k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int p = threadIdx.x + 128 * i;
            const int r = p >> 2, c = (p & 3) * 8;
            const int row = row0 + r;
            const bool a_in = k0 + c < k && row < row_end;
            copy16_async(shared_address(&a_tile[stage][r * MOE_LDS + c]),
                         x + (size_t)(a_in ? row : row0) * x_stride + (a_in ? k0 + c : 0), a_in);
            if (FORMAT == MOE_B_BF16) {
                size_t w_row;
                int kc;
                const bool b_in = b_piece(i, k0, w_row, kc);
                copy16_async(shared_address(&b_tile[stage][r * MOE_LDS + c]),
                             static_cast<const bf16*>(wt.w) + w_row * k + kc, b_in);
            }
        }
        asm volatile("cp.async.commit_group;");
    };
    const auto fetch_quantized = [&](int k0) {
        QuantizedPieces q;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            size_t w_row;
            int kc;
            q.in[i] = b_piece(i, k0, w_row, kc);
            q.codes[i] = make_uint2(0u, 0u);
            q.scale[i] = 0.0f;
            if (q.in[i] && FORMAT == MOE_B_FP8) {
                q.codes[i] = __ldg(reinterpret_cast<const uint2*>(static_cast<const e4m3*>(wt.w) + w_row * k + kc));
                q.scale[i] =
                    static_cast<const float*>(wt.scales)[w_row * wt.groups + (wt.groups > 1 ? kc / wt.group : 0)];
            } else if (q.in[i] && FORMAT == MOE_B_MXFP4) {
                const unsigned char* blocks = static_cast<const unsigned char*>(wt.w) + w_row * (k / 2);
                q.codes[i].x = __ldg(reinterpret_cast<const unsigned int*>(blocks + kc / 2));
                // The E8M0 scale byte travels in the float's bits until it is widened.
                q.scale[i] = __uint_as_float(static_cast<const unsigned char*>(wt.scales)[w_row * (k / 32) + kc / 32]);
            }
        }
        return q;
    };
    const auto store_quantized = [&](int stage, const QuantizedPieces& q) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int p = threadIdx.x + 128 * i;
            const int r = p >> 2, c = (p & 3) * 8;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (q.in[i] && FORMAT == MOE_B_FP8) {
                v = moe_widen8(q.codes[i], q.scale[i]);
            } else if (q.in[i] && FORMAT == MOE_B_MXFP4) {
                v = moe_widen8_mxfp4(q.codes[i].x, mx_e8m0(static_cast<unsigned char>(__float_as_uint(q.scale[i]))));
            }
            *reinterpret_cast<uint4*>(&b_tile[stage][r * MOE_LDS + c]) = v;
        }
    };
    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.0f;
    // This warp's B columns: two 16-column groups (SWIGLU: its gate columns and their up columns).
    const int n_base[2] = {SWIGLU ? 16 * wn : 32 * wn, SWIGLU ? MOE_BN / 2 + 16 * wn : 32 * wn + 16};
    const int steps = (k + MOE_BK - 1) / MOE_BK;
    constexpr bool QUANTIZED = FORMAT != MOE_B_BF16;
    load_async(0, 0);
    QuantizedPieces next{};
    if (QUANTIZED) store_quantized(0, fetch_quantized(0));
    for (int s = 0; s < steps; ++s) {
        const int stage = s & 1;
        if (s + 1 < steps) {
            load_async(stage ^ 1, (s + 1) * MOE_BK);
            if (QUANTIZED) next = fetch_quantized((s + 1) * MOE_BK);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MOE_BK; kk += 16) {
            unsigned int a[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const int r = wm * 32 + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int c = kk + (lane >> 4) * 8;
                ldmatrix_x4(shared_address(&a_tile[stage][r * MOE_LDS + c]), a[mi]);
            }
            unsigned int b[2][4];
#pragma unroll
            for (int g = 0; g < 2; ++g) {
                const int n = n_base[g] + (lane >> 4) * 8 + (lane & 7);
                const int c = kk + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(shared_address(&b_tile[stage][n * MOE_LDS + c]), b[g]);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    const unsigned int* bb = &b[ni >> 1][(ni & 1) * 2];
                    mma_bf16(acc[mi][ni], a[mi], bb[0], bb[1]);
                }
            }
        }
        __syncthreads();
        // Every warp is done with this stage, so the next stage's buffer (read last in the
        // previous step) takes the widened weights; the next step's barrier publishes them.
        if (QUANTIZED && s + 1 < steps) store_quantized(stage ^ 1, next);
    }
    // Lane (g, t) holds, per 16 x 8 tile, rows g and g + 8, columns 2t and 2t + 1.
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = row0 + wm * 32 + mi * 16 + g + half * 8;
            if (row >= row_end) continue;
            if (SWIGLU) {
#pragma unroll
                for (int ni = 0; ni < 2; ++ni) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int col = col0 + 16 * wn + ni * 8 + 2 * t + j;
                        if (col < n_out) {
                            const float gate = acc[mi][ni][half * 2 + j];
                            const float up = acc[mi][ni + 2][half * 2 + j];
                            static_cast<bf16*>(out)[(size_t)row * n_out + col] =
                                f32_to_bf16(GPTOSS ? moe_gptoss_glu(gate, up, wt.bias + first_row + 2 * col)
                                                   : silu_times(gate, up));
                        }
                    }
                }
            } else {
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int col = col0 + 32 * wn + ni * 8 + 2 * t + j;
                        if (col < n_out) {
                            // Without a bias the sum is stored as it is (adding 0.0f would turn -0.0 into +0.0).
                            const float sum = acc[mi][ni][half * 2 + j];
                            static_cast<float*>(out)[(size_t)row * n_out + col] =
                                GPTOSS ? sum + bf16_to_f32(wt.bias[first_row + col]) : sum;
                        }
                    }
                }
            }
        }
    }
}
#endif

// The grouped GEMMs' entries (128 threads; grid (column blocks, row tiles of the step at most),
// the blocks past the step's tiles return at once). Without tensor cores the host keeps the
// small-M entries for every step.
#ifndef MOE_NO_ENTRIES
extern "C" __global__ void __launch_bounds__(128)
    moe_gemm_gate_up(const bf16* __restrict__ x_perm, const bf16* __restrict__ w, const int* __restrict__ meta,
                     bf16* __restrict__ h_perm, int x_stride) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<true, MOE_B_BF16, false>(x_perm, x_stride, MoeTileWeights{w, nullptr, 1, 0, nullptr}, meta, h_perm,
                                             MOE_INTER, HIDDEN);
#endif
}

extern "C" __global__ void __launch_bounds__(128)
    moe_gemm_down(const bf16* __restrict__ h_perm, const bf16* __restrict__ w, const int* __restrict__ meta,
                  float* __restrict__ y_perm) {
    await_previous_kernels();
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    moe_gemm_tile<false, MOE_B_BF16, false>(h_perm, MOE_INTER, MoeTileWeights{w, nullptr, 1, 0, nullptr}, meta, y_perm,
                                              HIDDEN, MOE_INTER);
#endif
}
#endif

// The down product and the combine in one, for a step of one token (decode at batch 1): block x
// owns MOE_ONE_ROWS consecutive output columns; warp w computes the token's slots w, w +
// MOE_ONE_WARPS, ... (slot s: expert topk_ids[s] against its permuted row row_of[s] of h_perm)
// over the whole expert width on CUDA cores, each lane reading 16 bytes of every owned row per
// 256-value step, all loads of MOE_ONE_GROUP steps issued before their sums (the launch bound's
// minimum of one block lets the compiler keep them all in registers; without it ptxas interleaved
// loads and sums, 3 loads in flight per warp instead of 15); the block then adds the slots' sums
// weighted, in slot order, and the shared expert's output scaled by its gate, as moe_combine
// does. The same weights as moe_down are read, in half the blocks at Qwen3-30B-A3B's shape, and
// neither y_perm nor moe_combine's launch is needed.
#define MOE_ONE_ROWS 4
#define MOE_ONE_WARPS (MOE_TOP_K < 8 ? MOE_TOP_K : 8)
#define MOE_ONE_GROUP 3
#define MOE_ONE_STEPS (MOE_INTER / 256)

// N whole steps from column k0 (lane's 8 values at k0 + 256 u + 8 lane) into acc: every load
// first, then the sums, so N * (MOE_ONE_ROWS + 1) 16-byte loads per lane are in flight.
template <int N>
__device__ __forceinline__ void moe_one_steps(const bf16* const (&rows)[MOE_ONE_ROWS], const bf16* __restrict__ x,
                                              int k0, float (&acc)[MOE_ONE_ROWS]) {
    const int lane = threadIdx.x & 31;
    uint4 wv[N][MOE_ONE_ROWS];
    uint4 xv[N];
#pragma unroll
    for (int u = 0; u < N; ++u) {
        const int k = k0 + u * 256 + lane * 8;
        xv[u] = __ldg(reinterpret_cast<const uint4*>(x + k));
#pragma unroll
        for (int r = 0; r < MOE_ONE_ROWS; ++r) wv[u][r] = __ldg(reinterpret_cast<const uint4*>(rows[r] + k));
    }
#pragma unroll
    for (int u = 0; u < N; ++u) {
        float xf[8];
        gemv_unpack8(xv[u], xf);
#pragma unroll
        for (int r = 0; r < MOE_ONE_ROWS; ++r) {
            float wf[8];
            gemv_unpack8(wv[u][r], wf);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r] = fmaf(xf[i], wf[i], acc[r]);
        }
    }
}

#ifndef MOE_NO_ENTRIES
extern "C" __global__ void __launch_bounds__(MOE_ONE_WARPS * 32, 1)
    moe_down_combine_one(const bf16* __restrict__ h_perm, const bf16* __restrict__ w, const int* __restrict__ topk_ids,
                         const int* __restrict__ row_of, const float* __restrict__ topk_weights,
                         const float* __restrict__ logits, const float* __restrict__ shared,
                         float* __restrict__ delta) {
    __shared__ float partial[MOE_TOP_K][MOE_ONE_ROWS];
    await_previous_kernels();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int n0 = blockIdx.x * MOE_ONE_ROWS;
    for (int s = warp; s < MOE_TOP_K; s += MOE_ONE_WARPS) {
        const bf16* x = h_perm + (size_t)row_of[s] * MOE_INTER;
        const bf16* rows[MOE_ONE_ROWS];
#pragma unroll
        for (int r = 0; r < MOE_ONE_ROWS; ++r) {
            // Columns past HIDDEN read the last row again and are not written.
            rows[r] = w + ((size_t)topk_ids[s] * HIDDEN + min(n0 + r, HIDDEN - 1)) * MOE_INTER;
        }
        float acc[MOE_ONE_ROWS];
#pragma unroll
        for (int r = 0; r < MOE_ONE_ROWS; ++r) acc[r] = 0.0f;
        // Whole steps in groups, the rest of them one by one, then a partial step (a width that
        // is not a multiple of 256: lanes past it read nothing).
        constexpr int grouped = MOE_ONE_STEPS / MOE_ONE_GROUP * MOE_ONE_GROUP;
        for (int step = 0; step < grouped; step += MOE_ONE_GROUP) moe_one_steps<MOE_ONE_GROUP>(rows, x, step * 256, acc);
        for (int step = grouped; step < MOE_ONE_STEPS; ++step) moe_one_steps<1>(rows, x, step * 256, acc);
        if (MOE_INTER % 256 != 0 && MOE_ONE_STEPS * 256 + lane * 8 < MOE_INTER) {
            moe_one_steps<1>(rows, x, MOE_ONE_STEPS * 256, acc);
        }
#pragma unroll
        for (int r = 0; r < MOE_ONE_ROWS; ++r) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) partial[s][r] = v;
        }
    }
    __syncthreads();
    const int r = threadIdx.x;
    if (r < MOE_ONE_ROWS && n0 + r < HIDDEN) {
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < MOE_TOP_K; ++s) acc += topk_weights[s] * partial[s][r];
        if (shared != nullptr) {
            const float shared_scale = 1.0f / (1.0f + expf(-logits[MOE_EXPERTS]));
            acc += shared_scale * shared[n0 + r];
        }
        delta[n0 + r] = acc;
    }
}
#endif

// SwiGLU of the shared expert's gate/up product [T, 2 * MOE_SHARED_INTER] fp32 (gate half first)
// into [T, MOE_SHARED_INTER] bf16. Grid (ceil(MOE_SHARED_INTER / blockDim.x), T).
#ifndef MOE_NO_ENTRIES
extern "C" __global__ void moe_shared_swiglu(const float* __restrict__ gate_up, bf16* __restrict__ out) {
    await_previous_kernels();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= MOE_SHARED_INTER) return;
    const float* row = gate_up + (size_t)t * 2 * MOE_SHARED_INTER;
    out[(size_t)t * MOE_SHARED_INTER + i] = f32_to_bf16(silu_times(row[i], row[MOE_SHARED_INTER + i]));
}
#endif

// Token blockIdx.x's MLP output: its permuted rows weighted and summed in slot order, plus the
// shared expert's output (`shared`, [T, HIDDEN] fp32; null without one) scaled by the sigmoid of
// its gate's logit (the router product's last column).
#ifndef MOE_NO_ENTRIES
extern "C" __global__ void moe_combine(const float* __restrict__ y_perm, const int* __restrict__ row_of,
                                       const float* __restrict__ topk_weights, const float* __restrict__ logits,
                                       const float* __restrict__ shared, float* __restrict__ delta) {
    await_previous_kernels();
    const int t = blockIdx.x;
    int rows[MOE_TOP_K];
    float weights[MOE_TOP_K];
#pragma unroll
    for (int s = 0; s < MOE_TOP_K; ++s) {
        rows[s] = row_of[t * MOE_TOP_K + s];
        weights[s] = topk_weights[t * MOE_TOP_K + s];
    }
    float shared_scale = 0.0f;
    if (shared != nullptr) shared_scale = 1.0f / (1.0f + expf(-logits[(size_t)t * MOE_LOGITS + MOE_EXPERTS]));
    for (int h = threadIdx.x; h < HIDDEN; h += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < MOE_TOP_K; ++s) acc += weights[s] * y_perm[(size_t)rows[s] * HIDDEN + h];
        if (shared != nullptr) acc += shared_scale * shared[(size_t)t * HIDDEN + h];
        delta[(size_t)t * HIDDEN + h] = acc;
    }
}
#endif
