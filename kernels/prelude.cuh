// Shared helpers prepended to every kernel family before NVRTC compiles it.
//
// The host prepends a block of `#define`s with the model's shapes (HIDDEN, HEAD_DIM, NUM_Q_HEADS,
// NUM_KV_HEADS, VOCAB, INTERMEDIATE, KV_BLOCK, RMS_EPS, QKV_BIAS, QK_NORM, SLIDING_WINDOW,
// MAX_TOP_LOGPROBS), so every loop bound below is a compile-time constant.
// bf16 values travel as raw 16-bit patterns: the kernels need no CUDA headers, so NVRTC compiles
// them without include paths on any machine.

typedef unsigned short bf16;

// Positive infinity without <cmath>.
#define INFINITY __int_as_float(0x7f800000)

// Programmatic dependent launch (compute capability 9.0 and later). The host launches every
// kernel so that it may be scheduled before the previous kernel in the stream has finished
// (src/backend/cuda/backend.rs), so each kernel calls this before it touches anything an earlier
// kernel wrote or reads: it waits until those kernels have finished and their writes are
// visible, then lets the next kernel's blocks be scheduled while this one runs. Only reads of
// constant data (weights) may come before it. Without that launch attribute, and on older GPUs,
// it does nothing.
__device__ __forceinline__ void await_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
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
