// Shared helpers prepended to every kernel family before NVRTC compiles it.
//
// The host prepends a block of `#define`s with the model's shapes (HIDDEN, HEAD_DIM, NUM_Q_HEADS,
// NUM_KV_HEADS, VOCAB, INTERMEDIATE, KV_BLOCK, RMS_EPS, QKV_BIAS, QK_NORM, SLIDING_WINDOW,
// MAX_TOP_LOGPROBS), so every loop bound below is a compile-time constant.
// bf16 values travel as raw 16-bit patterns: the kernels need no CUDA headers, so NVRTC compiles
// them without include paths on any machine.

typedef unsigned short bf16;

// The KV cache's element: with KV_FP8 1 (from the host, --kv-cache-dtype fp8) an E4M3 byte that
// holds value / scale (one k and one v scale per layer, kv_scales[0] and [1]); else bf16. The
// kernels that write the cache (kernels/qkv_rope.cu, gemv.cu) and read it (attention.cu,
// prefill_attention.cu) select their code by KV_FP8 at compile time, so the bf16 build's code is
// the same as without it.
#ifndef KV_FP8
#define KV_FP8 0
#endif
#if KV_FP8
typedef unsigned char kv_t;
#else
typedef bf16 kv_t;
#endif

// Positive infinity without <cmath>.
#define INFINITY __int_as_float(0x7f800000)

// Attention sinks (ATTN_SINKS 1 from the host, gpt-oss's `self_attn.sinks`): one logit per query
// head, in the scaled scores' domain, that joins every softmax's denominator and adds nothing to
// the output. The attention kernels (attention.cu, prefill_attention.cu) take the layer's sinks,
// float [NUM_Q_HEADS], and add exp(sink - max) to each head's sum where they normalise it; a build
// without sinks never reads the pointer.
#ifndef ATTN_SINKS
#define ATTN_SINKS 0
#endif

// The softmax sum `total` of query head `head` (0 to NUM_Q_HEADS - 1), whose maximum is `big` in
// the log2 domain, with the head's sink joined (unchanged without sinks). With no key (`big`
// -inf) the sum is infinite and the output zero.
__device__ __forceinline__ float sink_total(float total, float big, const float* __restrict__ sinks, int head) {
#if ATTN_SINKS
    return total + exp2f(fmaf(sinks[head], 1.4426950408889634f, -big));
#else
    return total;
#endif
}

// Programmatic dependent launch (compute capability 9.0 and later). The host launches every
// kernel so that it may be scheduled before the previous kernel in the stream has finished
// (src/backend/cuda/backend.rs). start_next_kernels lets the next kernel's blocks be scheduled
// while this one runs; the next kernel still waits for this one to finish before it reads
// anything this one writes. Without that launch attribute, and on older GPUs, it does nothing.
__device__ __forceinline__ void start_next_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Each kernel calls this before it touches anything an earlier kernel wrote or reads: it waits
// until those kernels have finished and their writes are visible, then starts the next kernels.
// Only reads of what no kernel of the step writes (weights, the step's inputs, the keys and
// values of earlier steps) may come before it. A kernel of few blocks may call
// start_next_kernels before it (attention_reduce), so the next kernel's blocks take the SMs the
// previous kernel frees while this one still waits.
__device__ __forceinline__ void await_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    start_next_kernels();
}

// Widens a bf16 bit pattern to float (exact).
__device__ __forceinline__ float bf16_to_f32(bf16 v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

// Rounds a float to bf16 (round to nearest, ties to even; NaN stays NaN).
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// SwiGLU of one element: silu(gate) * up, in fp32 (kernels/swiglu.cu, and the small-M product
// that applies it to its own output, kernels/gemv.cu).
__device__ __forceinline__ float silu_times(float gate, float up) {
    return gate / (1.0f + expf(-gate)) * up;
}

// Rotary embedding of one pair of a head ("rotate half": dims i and i + HEAD_DIM / 2) by `angle`,
// in place (kernels/qkv_rope.cu, and the small-M product that writes q, k and v itself,
// kernels/gemv.cu), so both paths round the same way.
__device__ __forceinline__ void rotate_pair(float angle, float& lo, float& hi) {
    float s, c;
    sincosf(angle, &s, &c);
    const float a = lo;
    const float b = hi;
    lo = a * c - b * s;
    hi = b * c + a * s;
}

#if KV_FP8
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "an FP8 KV cache needs compute capability 8.9 or newer (E4M3 conversions)"
#endif
// Two floats rounded to E4M3 (nearest, ties to even; beyond +-448 saturated), `lo` in the low
// byte.
__device__ __forceinline__ unsigned short e4m3x2_from_f32(float lo, float hi) {
    unsigned short packed;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// Two E4M3 bytes (the low one first) widened to an f16 pair, exactly.
__device__ __forceinline__ unsigned int f16x2_from_e4m3x2(unsigned int pair) {
    unsigned int widened;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(widened) : "h"((unsigned short)pair));
    return widened;
}

// Widens an f16 bit pattern to float (exact).
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Rounds a bf16 pair to an f16 pair (exact for the queries' range: f16 has the longer mantissa).
__device__ __forceinline__ unsigned int f16x2_from_bf16x2(unsigned int pair) {
    unsigned int packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;"
        : "=r"(packed)
        : "f"(__uint_as_float(pair & 0xffff0000u)), "f"(__uint_as_float(pair << 16)));
    return packed;
}

// Eight E4M3 bytes (a uint2) widened to eight bf16 values in four words (exact: E4M3's range and
// mantissa fit bf16), the lower-indexed value of each pair in the low half.
__device__ __forceinline__ uint4 bf16x8_from_e4m3x8(uint2 bytes) {
    unsigned int out[4];
    const unsigned int in[2] = {bytes.x, bytes.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int h = f16x2_from_e4m3x2(in[i / 2] >> (16 * (i & 1)));
        const float lo = f16_to_f32((unsigned short)(h & 0xffffu));
        const float hi = f16_to_f32((unsigned short)(h >> 16));
        // Exact, so the truncation of the low halves loses nothing.
        out[i] = (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}
#endif

// Where head h (query heads first, then key heads, then value heads) of token t goes: a query
// head to q_out [T, NUM_Q_HEADS, HEAD_DIM], a key or value head to cache slot `slot` of its KV
// head (cache layout [slots][NUM_KV_HEADS][HEAD_DIM]; kernels/qkv_rope.cu and kernels/gemv.cu).
// The backend defines the head shapes for every family; a test harness built without them (the
// sampling kernel's) leaves this out.
#if defined(NUM_Q_HEADS) && defined(NUM_KV_HEADS) && defined(HEAD_DIM)
#if KV_FP8
// The cache row of key or value head h (h >= NUM_Q_HEADS) of cache slot `slot`.
__device__ __forceinline__ kv_t* kv_destination(int h, int slot, kv_t* k_cache, kv_t* v_cache) {
    if (h < NUM_Q_HEADS + NUM_KV_HEADS) return k_cache + ((size_t)slot * NUM_KV_HEADS + (h - NUM_Q_HEADS)) * HEAD_DIM;
    return v_cache + ((size_t)slot * NUM_KV_HEADS + (h - NUM_Q_HEADS - NUM_KV_HEADS)) * HEAD_DIM;
}

// Stores dimensions d and d + HEAD_DIM / 2 (lo, hi) of head h: a query head as bf16, a key or
// value head as E4M3 of the value divided by its layer's scale (kv_scales: k then v), as the CPU
// backend rounds them (src/backend/cpu/mod.rs).
__device__ __forceinline__ void qkv_store(int h, int t, int slot, int d, float lo, float hi, bf16* q_out,
                                          kv_t* k_cache, kv_t* v_cache, const float* kv_scales) {
    if (h < NUM_Q_HEADS) {
        bf16* dst = q_out + ((size_t)t * NUM_Q_HEADS + h) * HEAD_DIM;
        dst[d] = f32_to_bf16(lo);
        dst[d + HEAD_DIM / 2] = f32_to_bf16(hi);
        return;
    }
    const float scale = kv_scales[h < NUM_Q_HEADS + NUM_KV_HEADS ? 0 : 1];
    const unsigned short pair = e4m3x2_from_f32(lo / scale, hi / scale);
    kv_t* dst = kv_destination(h, slot, k_cache, v_cache);
    dst[d] = (kv_t)(pair & 0xffu);
    dst[d + HEAD_DIM / 2] = (kv_t)(pair >> 8);
}
#else
__device__ __forceinline__ bf16* qkv_destination(int h, int t, int slot, bf16* q_out, bf16* k_cache, bf16* v_cache) {
    if (h < NUM_Q_HEADS) return q_out + ((size_t)t * NUM_Q_HEADS + h) * HEAD_DIM;
    if (h < NUM_Q_HEADS + NUM_KV_HEADS) return k_cache + ((size_t)slot * NUM_KV_HEADS + (h - NUM_Q_HEADS)) * HEAD_DIM;
    return v_cache + ((size_t)slot * NUM_KV_HEADS + (h - NUM_Q_HEADS - NUM_KV_HEADS)) * HEAD_DIM;
}
#endif
#endif

// Sum over the 32 lanes of a warp; every lane receives the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// Maximum over the 32 lanes of a warp; every lane receives the result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

// Sum over a block of at most 1024 threads; every thread receives the result. `scratch` holds 32
// floats of shared memory, and the call ends with a barrier so it can be reused at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    __syncthreads();
    return total;
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// Tensor-core product (mma.sync m16n8k16, bf16 inputs, fp32 accumulation):
// c (16x8) += a (16x16, row-major) * b (16x8, column-major). Thread (group g = lane / 4,
// t = lane % 4) holds a[0] = rows g, columns 2t and 2t+1; a[1] = rows g+8; a[2] = row g, columns
// 2t+8 and 2t+9; a[3] = row g+8 of those; b0 = rows 2t and 2t+1 of column g, b1 = rows 2t+8 and
// 2t+9; c[0..1] = row g, columns 2t and 2t+1, c[2..3] = row g+8. The lower-indexed element of a
// pair sits in the low half of its word.
__device__ __forceinline__ void mma_bf16(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same product for an `a` whose rows 8-15 are zero: a_lo and a_hi are a[0] and a[2], and only
// rows 0-7 of c (c[0], c[1]) are kept, so the caller holds no registers for the empty half.
__device__ __forceinline__ void mma_bf16_upper(float* c, unsigned int a_lo, unsigned int a_hi, unsigned int b0,
                                               unsigned int b1) {
    float discarded0, discarded1;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %5}, "
        "{%7, %8}, {%0, %1, %9, %9};"
        : "+f"(c[0]), "+f"(c[1]), "=f"(discarded0), "=f"(discarded1)
        : "r"(a_lo), "r"(0u), "r"(a_hi), "r"(b0), "r"(b1), "f"(0.0f));
}

// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned int shared_address(const void* p) {
    unsigned int address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
    return address;
}

// Four 8x8 bf16 matrices from shared memory (thread i names row i % 8 of matrix i / 8).
__device__ __forceinline__ void ldmatrix_x4(unsigned int address, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// Copies 16 bytes from global to shared memory asynchronously (zeros when `valid` is false),
// past L1: for data no other block on the SM reads.
__device__ __forceinline__ void copy16_async(unsigned int dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// Two floats rounded to bf16 and packed, `lo` in the low half.
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    unsigned int packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}
#endif
