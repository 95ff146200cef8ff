// The KV cache's element in the attention harnesses (scripts/attention-check.cu,
// prefill-check.cu): bf16, or with -DKV_FP8=1 E4M3 bytes holding value / scale (one k and one v
// scale per layer, as the backend stores them: kernels/prelude.cuh). Host-side E4M3 rounding and
// widening (the reference the device conversions are checked against), the reference's view of
// a cached element, and the device check of the quantized write (qkv_store, which both kernels
// that write the cache use) and of the widening the attention kernels use. Include after
// prelude.cuh and check-common.cuh.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

// The value an E4M3 code holds (NaN for the two NaN codes).
static double e4m3_value(uint8_t code) {
    const double sign = (code & 0x80) ? -1.0 : 1.0;
    const int exponent = (code >> 3) & 15;
    const int mantissa = code & 7;
    if (exponent == 15 && mantissa == 7) return NAN;
    if (exponent == 0) return sign * mantissa / 8.0 * std::ldexp(1.0, -6);
    return sign * (1.0 + mantissa / 8.0) * std::ldexp(1.0, exponent - 7);
}

// `x` rounded to E4M3 (nearest, ties to the even code; beyond +-448 saturated; NaN to 0x7f): what
// cvt.rn.satfinite.e4m3x2.f32 does, by search over the 127 finite non-negative codes.
static uint8_t e4m3_code(float x) {
    if (std::isnan(x)) return 0x7f;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const double a = std::fabs((double)x);
    if (a >= 448.0) return sign | 0x7e;
    int best = 0;
    double best_gap = 1e300;
    for (int code = 0; code < 127; ++code) {
        const double gap = std::fabs(e4m3_value((uint8_t)code) - a);
        if (gap < best_gap || (gap == best_gap && (code & 1) == 0)) {
            best = code;
            best_gap = gap;
        }
    }
    return sign | (uint8_t)best;
}

#if KV_FP8
typedef uint8_t kv_host;
static const char* const KV_NAME = "fp8";
// A cache element holding `x` at `scale`.
static kv_host kv_encode(float x, float scale) { return e4m3_code(x / scale); }
// The value a cache element holds at `scale`.
static double kv_decode(kv_host e, double scale) { return e4m3_value(e) * scale; }
// An element that reads as NaN.
static const kv_host KV_NAN = 0x7f;
#else
typedef uint16_t kv_host;
static const char* const KV_NAME = "bf16";
static kv_host kv_encode(float x, float) { return to_bf16(x); }
static double kv_decode(kv_host e, double) { return from_bf16(e); }
static const kv_host KV_NAN = 0x7fc0;
#endif

// The scales the checks store: 1 for bf16 (not read), values that are no powers of two for FP8,
// so a scale applied twice or not at all shows.
static const float KV_K_SCALE = KV_FP8 ? 0.0123f : 1.0f;
static const float KV_V_SCALE = KV_FP8 ? 0.0071f : 1.0f;

// Fills n cache elements with hashed random valid elements (bf16 as fill_random makes them; FP8
// codes without the NaN pattern), for the benchmarks.
__global__ void fill_random_kv(kv_host* p, size_t n, uint32_t salt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t x = fill_hash(i, salt);
#if KV_FP8
        p[i] = (kv_host)((x >> 8) & 0xfeu);  // mantissa never 7: no NaN
#else
        p[i] = hashed_bf16(x, 121);
#endif
    }
}

#if KV_FP8
// Thread i stores value pair i (dimensions d and d + HEAD_DIM / 2 of key head 0 and value head 0
// of slot i / (HEAD_DIM / 2)) through qkv_store, as the kernels that write the cache do.
__global__ void store_pairs(const float* lo, const float* hi, int pairs, kv_t* k_cache, kv_t* v_cache,
                            const float* kv_scales) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const int slot = i / (HEAD_DIM / 2);
    const int d = i % (HEAD_DIM / 2);
    qkv_store(NUM_Q_HEADS, 0, slot, d, lo[i], hi[i], nullptr, k_cache, v_cache, kv_scales);
    qkv_store(NUM_Q_HEADS + NUM_KV_HEADS, 0, slot, d, lo[i], hi[i], nullptr, k_cache, v_cache, kv_scales);
}

// Widens every code, by the pair conversion and the eight-byte one to bf16.
__global__ void widen_codes(float* pairs, float* octets) {
    const int code = threadIdx.x;  // 256 threads
    const unsigned int h = f16x2_from_e4m3x2((unsigned int)code | ((unsigned int)(code ^ 0x80) << 8));
    pairs[2 * code] = f16_to_f32((unsigned short)(h & 0xffffu));
    pairs[2 * code + 1] = f16_to_f32((unsigned short)(h >> 16));
    const uint4 w = bf16x8_from_e4m3x8(make_uint2(0x01000000u * code, 0u));
    octets[code] = __uint_as_float(w.y & 0xffff0000u);  // byte 3: the high half of word 1
}

// Checks the quantized write and the widening against the host's E4M3 rounding on fresh random
// values (every binade E4M3 covers, its subnormals, exact ties, saturation, both signs); returns
// the mismatches.
static int check_kv_conversions(std::mt19937_64& rng) {
    const int slots = 4096;
    const int pairs = slots * (HEAD_DIM / 2);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> binade(-12, 10);
    std::vector<float> lo(pairs), hi(pairs);
    for (int i = 0; i < pairs; ++i) {
        lo[i] = std::ldexp(unit(rng), binade(rng)) * KV_K_SCALE;
        hi[i] = std::ldexp(unit(rng), binade(rng)) * KV_K_SCALE;
    }
    // Exact ties between two codes (1 + 1/16 lies between 1 and 1.125), and beyond the range.
    lo[0] = 1.0625f * KV_K_SCALE;
    hi[0] = -1.1875f * KV_K_SCALE;
    lo[1] = 500.0f * KV_K_SCALE;
    hi[1] = -1e30f;
    float* dlo = upload(lo);
    float* dhi = upload(hi);
    float* dscales = upload(std::vector<float>{KV_K_SCALE, KV_V_SCALE});
    const size_t elems = (size_t)slots * NUM_KV_HEADS * HEAD_DIM;
    kv_t *dk, *dv;
    CHECK(cudaMalloc(&dk, elems));
    CHECK(cudaMalloc(&dv, elems));
    store_pairs<<<(pairs + 255) / 256, 256>>>(dlo, dhi, pairs, dk, dv, dscales);
    const std::vector<kv_t> k = finish_and_download(dk, elems);
    const std::vector<kv_t> v = finish_and_download(dv, elems);
    int bad = 0;
    for (int i = 0; i < pairs; ++i) {
        const size_t at = (size_t)(i / (HEAD_DIM / 2)) * NUM_KV_HEADS * HEAD_DIM + i % (HEAD_DIM / 2);
        const kv_t want[4] = {e4m3_code(lo[i] / KV_K_SCALE), e4m3_code(hi[i] / KV_K_SCALE),
                              e4m3_code(lo[i] / KV_V_SCALE), e4m3_code(hi[i] / KV_V_SCALE)};
        const kv_t got[4] = {k[at], k[at + HEAD_DIM / 2], v[at], v[at + HEAD_DIM / 2]};
        for (int j = 0; j < 4; ++j) {
            if (got[j] != want[j] && bad++ < 10)
                fprintf(stderr, "MISMATCH write pair %d element %d: code 0x%02x, want 0x%02x\n", i, j, got[j], want[j]);
        }
    }
    float *dpairs, *doctets;
    CHECK(cudaMalloc(&dpairs, 512 * 4));
    CHECK(cudaMalloc(&doctets, 256 * 4));
    widen_codes<<<1, 256>>>(dpairs, doctets);
    const std::vector<float> widened = finish_and_download(dpairs, 512);
    const std::vector<float> octets = finish_and_download(doctets, 256);
    for (int code = 0; code < 256; ++code) {
        const double want[3] = {e4m3_value((uint8_t)code), e4m3_value((uint8_t)(code ^ 0x80)),
                                e4m3_value((uint8_t)code)};
        const double got[3] = {widened[2 * code], widened[2 * code + 1], octets[code]};
        for (int j = 0; j < 3; ++j) {
            if (std::isnan(want[j]) ? !std::isnan(got[j]) : got[j] != want[j]) {
                if (bad++ < 10) fprintf(stderr, "MISMATCH widen code 0x%02x (%d): %g, want %g\n", code, j, got[j], want[j]);
            }
        }
    }
    printf("RESULT kv fp8 conversions head_dim=%d: %s (%d mismatches over %d written pairs and 256 codes)\n", HEAD_DIM,
           bad ? "FAIL" : "ok", bad, pairs);
    CHECK(cudaFree(dlo));
    CHECK(cudaFree(dhi));
    CHECK(cudaFree(dscales));
    CHECK(cudaFree(dk));
    CHECK(cudaFree(dv));
    CHECK(cudaFree(dpairs));
    CHECK(cudaFree(doctets));
    return bad;
}
#endif
