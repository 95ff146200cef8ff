// A decode step's launch chain (batch CHAIN_M, default 1) on Llama-3.1-8B's shapes, built with
// nvcc on the GPU machine by scripts/gpu-check.sh (stage "chain", batches 1 and 8): 32 layers of
// norm, q/k/v (gemv_qkv_rope_mM), two kernels standing in for attention and its reduction (one
// block per row), o (gemv_mM), norm, gate/up with SwiGLU (gemv_swiglu_mM) and down (gemv_mM),
// each layer on its own weights, captured in a CUDA graph with programmatic dependent launch as
// the backend runs it. Prints the step time and the weights' read rate with and without the
// small kernels: how far the small-M kernels are from the copy bandwidth inside a graph, where
// launch costs are not what a stream-ordered benchmark (gemv-check.cu) sees.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include "check-common.cuh"
#undef INFINITY
#include "prelude.cuh"
#include "gemv.cu"
#include "rmsnorm.cu"

// Rows of x per product (the decode batch): CHAIN_M, 1 unless defined.
#ifndef CHAIN_M
#define CHAIN_M 1
#endif
#define CHAIN_PASTE(a, b) a##b
#define CHAIN_ENTRY(a, b) CHAIN_PASTE(a, b)
#define CHAIN_STR2(a) #a
#define CHAIN_STR(a) CHAIN_STR2(a)

template <typename... Args>
static void launch(bool pdl, void (*kernel)(Args...), dim3 grid, int threads, int smem, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    if (smem > 48 * 1024) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cfg.dynamicSmemBytes = smem;
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

int main() {
    const int layers = 32, hidden = 4096, inter = 14336, qkv_n = 6144;
    const double copy_bw = copy_bandwidth();
    const size_t per_layer = (size_t)qkv_n * hidden + (size_t)hidden * hidden + 2 * (size_t)inter * hidden + (size_t)hidden * inter;
    uint16_t* weights;
    CHECK(cudaMalloc(&weights, per_layer * layers * 2));
    fill_random<<<8192, 256>>>(weights, per_layer * layers, 5, 118);
    float *residual, *scratch;
    uint16_t *normed, *nw, *q, *kc, *vc, *mlp, *attn;
    float* inv_freq;
    int* ints;
    CHECK(cudaMalloc(&residual, CHAIN_M * hidden * 4));
    CHECK(cudaMalloc(&scratch, CHAIN_M * 2 * (size_t)inter * 4));
    CHECK(cudaMalloc(&normed, CHAIN_M * hidden * 2));
    CHECK(cudaMalloc(&attn, CHAIN_M * hidden * 2));
    CHECK(cudaMalloc(&nw, hidden * 2));
    CHECK(cudaMalloc(&q, CHAIN_M * hidden * 2));
    CHECK(cudaMalloc(&kc, 16 * 1024 * 2));
    CHECK(cudaMalloc(&vc, 16 * 1024 * 2));
    CHECK(cudaMalloc(&mlp, CHAIN_M * inter * 2));
    CHECK(cudaMalloc(&inv_freq, 64 * 4));
    CHECK(cudaMalloc(&ints, 8 * 4));
    CHECK(cudaMemset(residual, 0, CHAIN_M * hidden * 4));
    CHECK(cudaMemset(inv_freq, 0, 64 * 4));
    CHECK(cudaMemset(ints, 0, 8 * 4));
    fill_random<<<16, 256>>>(nw, hidden, 3, 121);
    fill_random<<<16, 256>>>(normed, CHAIN_M * hidden, 7, 121);
    fill_random<<<16, 256>>>(attn, CHAIN_M * hidden, 9, 121);
    CHECK(cudaDeviceSynchronize());
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int threads = GemvShape<CHAIN_M>::warps * 32, ring = GemvShape<CHAIN_M>::ring_bytes;
    for (int small : {1, 0}) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < layers; ++l) {
            const uint16_t* w = weights + per_layer * l;
            const uint16_t* w_qkv = w;
            const uint16_t* w_o = w_qkv + (size_t)qkv_n * hidden;
            const uint16_t* w_gu = w_o + (size_t)hidden * hidden;
            const uint16_t* w_down = w_gu + 2 * (size_t)inter * hidden;
            if (small) launch(true, add_rmsnorm, dim3(CHAIN_M), RMS_THREADS, 0, s, residual, (const float*)scratch, (const bf16*)nw, (const int*)nullptr, normed);
            launch(true, CHAIN_ENTRY(gemv_qkv_rope_m, CHAIN_M), dim3(qkv_n / GemvShape<CHAIN_M>::rows), threads, ring, s, (const bf16*)normed, (const bf16*)w_qkv, (const bf16*)nullptr,
                   (const float*)inv_freq, (const int*)ints, (const int*)ints, q, kc, vc, (const float*)nullptr, hidden);
            if (small) {
                // Stand-ins for attention and its reduction (one-block kernels: at batch 1 both are short).
                launch(true, add_rmsnorm, dim3(CHAIN_M), RMS_THREADS, 0, s, residual, (const float*)nullptr, (const bf16*)nw, (const int*)nullptr, attn);
                launch(true, add_rmsnorm, dim3(CHAIN_M), RMS_THREADS, 0, s, residual, (const float*)nullptr, (const bf16*)nw, (const int*)nullptr, attn);
            }
            launch(true, CHAIN_ENTRY(gemv_m, CHAIN_M), dim3(hidden / GemvShape<CHAIN_M>::rows), threads, ring, s, (const bf16*)attn, (const bf16*)w_o, scratch, hidden, hidden);
            if (small) launch(true, add_rmsnorm, dim3(CHAIN_M), RMS_THREADS, 0, s, residual, (const float*)scratch, (const bf16*)nw, (const int*)nullptr, normed);
            launch(true, CHAIN_ENTRY(gemv_swiglu_m, CHAIN_M), dim3(inter / GemvShape<CHAIN_M>::pairs), threads, ring, s, (const bf16*)normed, (const bf16*)w_gu, mlp, hidden);
            launch(true, CHAIN_ENTRY(gemv_m, CHAIN_M), dim3(hidden / GemvShape<CHAIN_M>::rows), threads, ring, s, (const bf16*)mlp, (const bf16*)w_down, scratch, hidden, inter);
        }
        CHECK(cudaStreamEndCapture(s, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        const int reps = 20;
        StreamTimer timer(s);
        for (int i = 0; i < reps; ++i) CHECK(cudaGraphLaunch(exec, s));
        const double ms = timer.seconds() * 1e3;
        const double bytes = (double)per_layer * layers * 2;
        const double rate = bytes / (ms / reps * 1e-3);
        printf("RESULT decode chain, batch %d, %s, %d rows per block, %d warps, %s, %s: %.3f ms per step (%.2f GB of weights: %.0f GB/s, %.0f%% of copy)\n",
               CHAIN_M, GemvShape<CHAIN_M>::tensor_cores ? "tensor cores" : "CUDA cores", GemvShape<CHAIN_M>::rows, GemvShape<CHAIN_M>::warps,
               GemvShape<CHAIN_M>::tensor_cores ? "chunk " CHAIN_STR(GEMV_MMA_CHUNK) " x " CHAIN_STR(GEMV_MMA_STAGES) " stages" : "unroll 2", small ? "with the small kernels" : "products only", ms / reps, bytes / 1e9, rate / 1e9,
               100.0 * rate / copy_bw);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
    }
    return 0;
}
