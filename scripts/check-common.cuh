// Helpers shared by the nvcc-built kernel harnesses in scripts/ (attention-check.cu,
// gemv-check.cu, prefill-check.cu, fp8-check.cu, moe-check.cu, moe-fp8-check.cu, ...): error
// checks, bf16 and E4M3 conversion on the host, uploads and downloads, the comparison with a
// float64 reference, random bf16 and E4M3 fill on the device, and the device copy bandwidth that
// benchmarks are measured against.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

// Rounds a float to bf16 (round to nearest even).
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// Widens a bf16 bit pattern to float.
static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// A device copy of `host` (at least one element allocated).
template <typename T>
static T* upload(const std::vector<T>& host) {
    T* dev = nullptr;
    CHECK(cudaMalloc(&dev, std::max<size_t>(1, host.size()) * sizeof(T)));
    CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return dev;
}

// Waits for the launches so far (exits on a launch or execution error) and copies `n` values
// back from `dev`.
template <typename T>
static std::vector<T> finish_and_download(const T* dev, size_t n) {
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n);
    CHECK(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

// Compares a kernel's bf16 output with its float64 reference element by element, within
// abs_tol + rel_tol * |reference| (NaN never passes). Up to `report` mismatches go to stderr,
// each described by `describe(index, got, want)`. Returns the number of mismatches and sets
// `worst` to the largest finite error.
template <typename Describe>
static int count_mismatches(const std::vector<uint16_t>& out, const std::vector<double>& ref, double abs_tol,
                            double rel_tol, int report, double& worst, Describe describe) {
    int mismatches = 0;
    worst = 0.0;
    for (size_t i = 0; i < out.size(); ++i) {
        const double got = from_bf16(out[i]);
        const double err = std::fabs(got - ref[i]);
        if (!(err <= abs_tol + rel_tol * std::fabs(ref[i]))) {
            if (mismatches < report) describe(i, got, ref[i]);
            ++mismatches;
        }
        if (err == err) worst = std::max(worst, err);
    }
    return mismatches;
}

// The device fills' hash of element i under `salt`.
__device__ __forceinline__ uint32_t fill_hash(size_t i, uint32_t salt) {
    uint32_t x = (uint32_t)i * 2654435761u ^ salt;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return x;
}

// The bf16 bits of hash `x` as a value of either sign whose exponent is `min_exponent` to
// `min_exponent + 5` (121: magnitudes in [2^-6, 1); 118: in [2^-9, 2^-3)).
__device__ __forceinline__ uint16_t hashed_bf16(uint32_t x, uint32_t min_exponent) {
    return (uint16_t)((x & 0x8000u) | ((min_exponent + (x >> 16) % 6u) << 7) | (x & 0x7fu));
}

// Fills n bf16 values with hashed random values (`hashed_bf16`).
__global__ void fill_random(uint16_t* p, size_t n, uint32_t salt, uint32_t min_exponent) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        p[i] = hashed_bf16(fill_hash(i, salt), min_exponent);
    }
}

// The host's E4M3 rounding (src/backend/cuda/fp8.rs's f32_to_e4m3_fast: nearest, ties to even,
// saturating), as kernels/fp8.cu's f32_to_e4m3 does it bit for bit.
static uint8_t host_e4m3(float x) {
    if (std::isnan(x)) return 0x7f;
    uint32_t bits;
    memcpy(&bits, &x, 4);
    const uint8_t sign = (bits >> 24) & 0x80;
    const float a = std::fabs(x);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0.015625f) return sign | (uint8_t)std::nearbyint(a * 512.0f);
    memcpy(&bits, &a, 4);
    const uint32_t mantissa = (bits >> 20) & 7, rest = bits & 0xfffff;
    uint32_t code = (((bits >> 23) - 120) << 3) | mantissa;
    if (rest > 0x80000 || (rest == 0x80000 && (mantissa & 1))) code += 1;
    return sign | (uint8_t)code;
}

// The value of an E4M3 code (exact in float, so also in double).
static float host_e4m3_value(uint8_t code) {
    const int e = (code >> 3) & 15, m = code & 7;
    const float magnitude = e == 0 ? m / 8.0f * std::ldexp(1.0f, -6) : (1 + m / 8.0f) * std::ldexp(1.0f, e - 7);
    return code & 0x80 ? -magnitude : magnitude;
}

// Random E4M3 bytes on the device, never a NaN code (bit 3 clear).
__global__ void fill_e4m3(uint8_t* p, size_t n, uint32_t salt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        p[i] = (uint8_t)(fill_hash(i, salt) & 0x77u);
    }
}

// Times the work queued on a stream between its construction and `seconds()`, with two CUDA
// events recorded on that stream.
struct StreamTimer {
    cudaStream_t stream;
    cudaEvent_t begin, end;
    explicit StreamTimer(cudaStream_t s = 0) : stream(s) {
        CHECK(cudaEventCreate(&begin));
        CHECK(cudaEventCreate(&end));
        CHECK(cudaEventRecord(begin, stream));
    }
    // Seconds from construction until the work queued since then has finished.
    double seconds() {
        CHECK(cudaEventRecord(end, stream));
        CHECK(cudaEventSynchronize(end));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, begin, end));
        return ms * 1e-3;
    }
    ~StreamTimer() {
        cudaEventDestroy(begin);
        cudaEventDestroy(end);
    }
};

// Device-to-device copy bandwidth in bytes per second, counting bytes read and written (1 GiB
// copied 10 times after 3 warm-up copies); printed as a RESULT line.
static double copy_bandwidth() {
    const size_t copy_bytes = (size_t)1 << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, copy_bytes));
    CHECK(cudaMalloc(&b, copy_bytes));
    for (int i = 0; i < 3; ++i) CHECK(cudaMemcpy(b, a, copy_bytes, cudaMemcpyDeviceToDevice));
    const int copies = 10;
    StreamTimer timer;
    for (int i = 0; i < copies; ++i) CHECK(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice));
    const double secs = timer.seconds();
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    const double bandwidth = 2.0 * copy_bytes * copies / secs;
    printf("RESULT copy bandwidth %.0f GB/s (read + write)\n", bandwidth / 1e9);
    return bandwidth;
}
