// Embedding gather: copies the embedding row of every step token into the fp32 residual stream.
//
// Grid: one block per token. Block: any width; threads stride over HIDDEN.
// tokens[t] < 0 marks padding: its residual row is set to zero.

extern "C" __global__ void embedding_gather(const bf16* __restrict__ table,
                                            const int* __restrict__ tokens,
                                            float* __restrict__ residual) {
    await_previous_kernels();
    const int t = blockIdx.x;
    const int token = tokens[t];
    float* out = residual + (size_t)t * HIDDEN;
    if (token < 0 || token >= VOCAB) {
        for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) out[i] = 0.0f;
        return;
    }
    const bf16* row = table + (size_t)token * HIDDEN;
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) out[i] = bf16_to_f32(row[i]);
}
