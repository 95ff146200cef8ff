#!/usr/bin/env bash
# Checks and benchmarks of the CUDA backend on the GPU machine, in as few device calls as possible.
#
# Run from the repository root with the prepared folder .gpu/ (see docs/cuda-backend.md):
#   .gpu/inferno           release binary          .gpu/cuda_backend   integration-test binary
#   .gpu/cuda_fp8          FP8 integration tests  .gpu/cuda_moe        MoE integration tests
#   .gpu/cuda_kv_fp8       FP8 KV cache integration tests
#   .gpu/unit_tests        library test binary     .gpu/*.py, .gpu/gpu-check.sh, .gpu/gpu-stages/
# Usage: bash .gpu/gpu-check.sh [STAGES]   (default: "env unit correctness sanitizer attention bench peers")
# Other stages: moe (issue 44: the MoE kernels alone, tests/cuda_moe.rs, memcheck; MOE_BENCH=1
# adds Qwen3-30B-A3B-shaped benches; see the stage), moefp8 (issue 44: FP8 experts' kernels alone,
# their tests/cuda_moe.rs test; MOE_FP8_BENCH=1 adds the Mixtral-8x7B-shaped FP8 batch-1 bench), fp8kv (issue 43: the FP8 KV cache's kernels,
# tests/cuda_kv_fp8.rs, and bf16 against FP8 caches in the decode attention bench and bench offline;
# .gpu/cuda_kv_fp8), fp8 (issue 43: FP8 correctness against the CPU reference, compute-sanitizer, FP8
# against bf16 benches on the 8B-shaped weights quantized at load; .gpu/cuda_fp8), quickbench (one offline run), graphs (offline batch 1/16/64 with decode graphs on
# and off, side by side), prefill (offline batch 16, input 1024 and 2048, 16 output tokens: TTFT),
# serve (bench serve over HTTPS), ohttp (the same load over attested TLS and over Oblivious HTTP,
# each through its local proxy, side by side, with the server's CPU per output token), auditbench (the audit log's serving cost, CPU backend, with the
# A/A calibration; .gpu/audit_bench), attention (the decode-attention kernels alone, built with
# nvcc from .gpu/kernels and .gpu/attention-check.cu: tests on fresh random data for every head
# configuration below, compute-sanitizer memcheck, and the K/V read bandwidth benchmark; with
# .gpu/attention-old.cu present, the same benchmark of that kernel for comparison; ATTN_TARGETS="N
# ..." benches the 8B heads again with N blocks per launch as the split target; ATTN_VARIANTS="NAME:DEFINES;..."
# builds, tests and benches them with other defines; ATTN_NCU="BATCH CONTEXT;..." profiles them), gemv (the
# small-M product kernels alone against cuBLASLt, .gpu/gemv-check.cu), prefillattn (the tensor-core
# prefill-attention kernel alone, .gpu/prefill-check.cu: tests, memcheck, FLOP rate), sealedstart (issue 10:
# start-up to first token of the 8B-shaped weights, plaintext then a sealed copy with a key file,
# same run; target sealed <= 1.10x; also read-buffer-bench.c's page-size comparison and, where the
# page cache can be dropped, a sequential read of the model and a start-up from a cold cache;
# COLD_BINS="inferno inferno-base" starts a second binary beside, warm and cold; WARM_RUNS=N
# and COLD_ROUNDS=N repeat the warm and the cold start-ups), libload (what the CUDA libraries cost a cold start-up, beside
# the model's read or not; after sealedstart),
# profile (ncu: GPU time per kernel of batch-1 decode steps at
# 1k context, eager launches, grouped by kernel; and of the steps that carry prompt tokens beside
# decode rows, when PROFILE_LOAD's load forms them), constrained (CPU and CUDA servers of the embedded
# model agree on constrained greedy outputs, or differ only at a teacher-forced near-tie within
# 0.1; JSON-schema-constrained vs free throughput at batch 1 and 64 on the 8B-shaped model, every
# request of both arms 128 tokens long, with the decode time per token and the engine's wait for
# grammar masks per step; target cost <= 5%), sampling (the sampling kernel alone,
# .gpu/sampling-check.cu: its draws against .gpu/sampling-old.cu's byte for byte, sanitizers,
# microseconds per launch), chain (decode steps' small-M kernels in a CUDA graph with programmatic
# launch, .gpu/decode-chain-check.cu: step time and read rate; CHAIN_BATCHES, CHAIN_VARIANTS, CHAIN_NCU),
# embed and constrainedqwen (issue 46; see their block), spec (issue 51: speculative decoding and
# per-position logits on CUDA, .gpu/cuda_speculative and bench offline), gptoss (issue 45: the
# attention kernels with sinks and windows, .gpu/attention-check.cu and prefill-check.cu),
# kvgroups (issue 45: gpt-oss's sliding layers' KV blocks freed, .gpu/cuda_gpt_oss), gptoss120b (issue 45:
# all 36 layers of gpt-oss-120b-shaped weights, batch 1 and 64 decode and the KV cache left beside them).
# Logs and JSON are written to a work folder and packed into $OUT/results.tgz after each stage
# file (the device tool returns at most 8 files); $OUT/summary.txt is also printed last.
# Only reads the GPU's state; never changes a GPU setting.
set -uo pipefail
G=$(cd "$(dirname "$0")" && pwd)
FINAL=${OUT:-/tmp/gpu-check-out}
OUT=/tmp/gpu-check-work
rm -rf "$OUT"
mkdir -p "$OUT" "$FINAL"
STAGES=${1:-"env unit correctness sanitizer attention bench peers"}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

# CUDA 13 libraries: the toolkit's, else the pip wheels'.
LIBS=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/lib /usr/lib \
  \( -name 'libnvrtc.so.13*' -o -name 'libcublasLt.so.13*' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:-}"
export INFERNO_KERNEL_CACHE=/tmp/inferno-kernels
export INFERNO_FIXTURES=$PWD/tests/fixtures
export RUST_LOG=${RUST_LOG:-info}
PATH=/usr/local/cuda/bin:$PATH
# libxmlsec1/libxml2 and their dependencies, carried by gpu-pack.sh, for our binaries only.
mkdir -p /tmp/inferno-lib
[ -f "$G/lib.tar.xz" ] && tar -xJf "$G/lib.tar.xz" -C /tmp/inferno-lib
# The binaries travel xz-compressed (gpu-pack.sh).
[ -f "$G/bins.tar.xz" ] && tar -xJf "$G/bins.tar.xz" -C "$G"
RUN="env LD_LIBRARY_PATH=/tmp/inferno-lib/lib:$LD_LIBRARY_PATH"
note "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?') (lead checkout) + .gpu binaries built from $(cat "$G/BUILD_COMMIT" 2>/dev/null || echo '?')"

# The stages, one file per family, in the order they run.
# After each file whose stages noted something, and at the end, the results so far are packed into
# $FINAL, so a call cut off by its time limit still brings back every stage that finished.
packed=
for stage_file in "$G"/gpu-stages/*.sh; do
  # shellcheck source=/dev/null
  source "$stage_file"
  size=$(wc -c <"$SUMMARY")
  [ "$size" = "$packed" ] && continue
  tar czf "$FINAL/results.tgz" -C "$OUT" .
  cp "$SUMMARY" "$FINAL/summary.txt"
  packed=$size
done
tar czf "$FINAL/results.tgz" -C "$OUT" .
cp "$SUMMARY" "$FINAL/summary.txt"
echo "===== summary"
cat "$SUMMARY"
