#!/usr/bin/env bash
# Checks and benchmarks of the CUDA backend on the GPU machine, in as few device calls as possible.
#
# Run from the repository root with the prepared folder .gpu/ (see docs/cuda-backend.md):
#   .gpu/inferno           release binary          .gpu/cuda_backend   integration-test binary
#   .gpu/cuda_fp8          FP8 integration tests  .gpu/cuda_moe        MoE integration tests
#   .gpu/cuda_kv_fp8       FP8 KV cache integration tests
#   .gpu/unit_tests        library test binary     .gpu/*.py, .gpu/gpu-check.sh
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
# kvgroups (issue 45: gpt-oss's sliding layers' KV blocks freed, .gpu/cuda_gpt_oss).
# Logs and JSON are written to a work folder and packed into $OUT/results.tgz (the device tool
# returns at most 8 files); $OUT/summary.txt is also printed last.
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

if has env; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,power.limit --format=csv >"$OUT/env.txt" 2>&1
  nvidia-smi -q 2>/dev/null | grep -i -A3 -E "confidential|conf comp" >>"$OUT/env.txt"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$OUT/env.txt"
  note "device: $(head -2 "$OUT/env.txt" | tail -1)"
fi

if has unit && [ -x "$G/unit_tests" ]; then
  $RUN "$G/unit_tests" backend::cuda --include-ignored --test-threads=4 >"$OUT/unit.log" 2>&1
  note "unit tests (backend::cuda): rc=$? $(grep -E '^test result' "$OUT/unit.log")"
fi

if has correctness; then
  $RUN "$G/cuda_backend" --include-ignored --test-threads=1 --nocapture >"$OUT/correctness.log" 2>&1
  rc=$?
  note "correctness (tests/cuda_backend/): rc=$rc $(grep -E '^test result' "$OUT/correctness.log")"
  grep -E '^RESULT|panicked|FAILED|SKIPPED' "$OUT/correctness.log" | head -40 | tee -a "$SUMMARY"
fi

if has sanitizer; then
  timeout 300 $RUN compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
    "$G/cuda_backend" --include-ignored --test-threads=1 "${SANITIZE_FILTER:-device_sampling}" >"$OUT/sanitizer.log" 2>&1
  note "compute-sanitizer memcheck (tests matching ${SANITIZE_FILTER:-device_sampling}): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
fi

# The decode-attention kernel's defines from src/backend/cuda/plan.rs (ATTN_WARPS, ATTN_DEPTH,
# MIN_PARTITION, ATTN_REDUCE_THREADS), for the decode and prefill harnesses alike.
ATTN_GEOMETRY="-DATTN_WARPS=4 -DATTN_DEPTH=2 -DATTN_MIN_PARTITION=32 -DATTN_REDUCE_THREADS=128"

# Decode attention alone: one binary per head configuration "q_heads kv_heads head_dim window"
# (GQA groups 1 to 8, head_dim 64 and 128, sliding windows, and the fixtures' 16 and 32).
ATTN_CONFIGS=${ATTN_CONFIGS:-"8 8 64 0;8 8 128 0;16 8 64 0;16 8 128 0;12 4 128 0;32 8 64 0;32 8 128 0;20 4 128 0;24 4 64 0;28 4 128 0;16 2 64 0;16 2 128 0;64 8 128 0;32 8 128 300;16 2 64 100;4 2 96 0;4 2 256 0;4 2 16 0;4 2 32 0"}
if has attention; then
  A=$OUT/attention
  mkdir -p "$A"
  # The backend's defines (src/backend/cuda/plan.rs); ATTN_VARIANTS="NAME:DEFINES;..." builds the
  # 8B heads again with DEFINES instead (say "-DATTN_MERGE_SPLITS=64"), tested
  # and benched beside as attn-NAME-32-8-128-0.
  ATTN_DEFINES="-DATTN_MERGE_SPLITS=8"
  attn_build() { # NAME SOURCE_DIR Q KV HEAD_DIM WINDOW [DEFINES]
    nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I"$2" -I"$G/kernels" -DNUM_Q_HEADS=$3 -DNUM_KV_HEADS=$4 -DHEAD_DIM=$5 \
      -DSLIDING_WINDOW=$6 -DKV_BLOCK=16 $ATTN_GEOMETRY ${7:-$ATTN_DEFINES} -Xptxas -v \
      "$G/attention-check.cu" -o "$A/$1" >"$A/$1.build.log" 2>&1 || echo "BUILD FAILED $1" | tee -a "$SUMMARY"
  }
  IFS=';' read -ra ATTN_VARIANT_LIST <<<"${ATTN_VARIANTS:-}"
  ATTN_VARIANT_NAMES=()
  for named in "${ATTN_VARIANT_LIST[@]}"; do
    ATTN_VARIANT_NAMES+=("attn-${named%%:*}-32-8-128-0")
    attn_build "${ATTN_VARIANT_NAMES[-1]}" "$G/kernels" 32 8 128 0 "${named#*:}" &
  done
  IFS=';' read -ra ATTN_LIST <<<"$ATTN_CONFIGS"
  for cfg in "${ATTN_LIST[@]}"; do
    set -- $cfg
    attn_build "attn-$1-$2-$3-$4" "$G/kernels" "$@" &
  done
  [ -f "$G/attention-old.cu" ] && { mkdir -p "$A/old" && cp "$G/attention-old.cu" "$A/old/attention.cu" && attn_build attn-old-32-8-128-0 "$A/old" 32 8 128 0 & }
  wait
  grep -h -A2 "for paged_attention" "$A"/attn-32-8-128-0.build.log "$A"/attn-16-2-128-0.build.log 2>/dev/null | grep -E "Used|spill" | tee -a "$SUMMARY"
  for name in "${ATTN_VARIANT_NAMES[@]}"; do
    grep -h -A2 "for paged_attention" "$A/$name.build.log" | grep -E "Used|spill" | sed "s/^/$name /" | tee -a "$SUMMARY"
    "$A/$name" test >"$A/test-$name.log" 2>&1
    note "attention test $name: rc=$? $(grep -h '^RESULT' "$A/test-$name.log")"
  done
  fails=0
  for cfg in "${ATTN_LIST[@]}"; do
    set -- $cfg
    "$A/attn-$1-$2-$3-$4" test >"$A/test-$1-$2-$3-$4.log" 2>&1 || fails=$((fails + 1))
    grep -h '^RESULT' "$A/test-$1-$2-$3-$4.log" >>"$SUMMARY" || echo "attention test $cfg: no result" | tee -a "$SUMMARY"
  done
  note "attention kernel tests: ${#ATTN_LIST[@]} configurations, $fails failed"
  for name in attn-32-8-128-0 attn-16-2-64-100 attn-4-2-96-0; do
    [ -x "$A/$name" ] || continue  # not among ATTN_CONFIGS
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$A/$name" test >"$A/sanitizer-$name.log" 2>&1
    note "compute-sanitizer memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY' "$A/sanitizer-$name.log" | tail -1)"
  done
  for name in attn-32-8-128-0 attn-old-32-8-128-0 "${ATTN_VARIANT_NAMES[@]}" attn-64-8-128-0; do
    [ -x "$A/$name" ] || continue
    timeout 240 "$A/$name" bench >"$A/bench-$name.log" 2>&1
    note "attention bench $name: rc=$?"
    grep -h '^RESULT' "$A/bench-$name.log" | sed "s/^/$name /" >>"$SUMMARY"
  done
  # ATTN_NCU="BATCH CONTEXT;...": ncu of the 8B heads' eager launches at that batch and context
  # (kernel alone, clocks free): duration, DRAM throughput, occupancy, warp stalls, and the spread
  # of active cycles over SMs (a wave's tail).
  IFS=';' read -ra ATTN_NCU_LIST <<<"${ATTN_NCU:-}"
  for spec in "${ATTN_NCU_LIST[@]}"; do
    set -- $spec
    timeout 200 ncu --clock-control none -k regex:"paged_attention|attention_reduce" --launch-skip 10 --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats \
      --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.avg \
      "$A/attn-32-8-128-0" bench 0 "$1" "$2" >"$A/ncu-attn-$1-$2.txt" 2>&1
    note "ncu attention batch $1 context $2: rc=$?"
    grep -E "^  [a-z_]+\(|  Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|sm__cycles|No Eligible|Warp Cycles Per Issued|Grid Size|Waves Per SM" \
      "$A/ncu-attn-$1-$2.txt" | sed "s/^/  /" >>"$SUMMARY"
  done
  # ATTN_TARGETS="N ...": the 8B heads' bench again with N blocks per launch as the split target.
  for target in ${ATTN_TARGETS:-}; do
    timeout 240 "$A/attn-32-8-128-0" bench "$target" >"$A/bench-target-$target.log" 2>&1
    note "attention bench attn-32-8-128-0 with $target target blocks: rc=$?"
    grep -h '^RESULT' "$A/bench-target-$target.log" | sed "s/^/target-$target /" >>"$SUMMARY"
  done
fi

# Small-M products alone (kernels/gemv.cu): tests on fresh random data for M 1..8 with every M on
# tensor cores (GEMV_MMA_FROM=1) and every M on CUDA cores (9), then the 8B model's decode products
# against cuBLASLt's heuristic choice in the backend's geometry (GEMV_DEFINES, as plan.rs passes).
GEMV_DEFINES=${GEMV_DEFINES:-"-DGEMV_ROWS=4 -DGEMV_WARPS=4 -DGEMV_MMA_FROM=1 -DGEMV_MMA_WARPS=8 -DGEMV_MMA_STAGES=5"}
SHAPE_DEFINES="-DHIDDEN=4096 -DHEAD_DIM=128 -DNUM_Q_HEADS=32 -DNUM_KV_HEADS=8 -DINTERMEDIATE=14336 -DQKV_BIAS=0 -DQK_NORM=0 -DRMS_EPS=1e-5f -DSWIGLU_VEC=4 -DRMS_THREADS=1024"
if has gemv; then
  A=$OUT/gemv
  mkdir -p "$A"
  built=1
  for from in 1 9 default; do
    defines="$GEMV_DEFINES"
    [ "$from" = default ] || defines="$GEMV_DEFINES -DGEMV_MMA_FROM=$from"
    # A later -D of the same name wins (nvcc warns).
    nvcc -O3 -arch=sm_90a -std=c++17 -I"$G/kernels" $defines $SHAPE_DEFINES -Xptxas -v "$G/gemv-check.cu" -lcublasLt -o "$A/gemv-check-$from" >"$A/build-$from.log" 2>&1 &
  done
  wait
  for from in 1 9 default; do
    [ -x "$A/gemv-check-$from" ] || { built=0; note "gemv-check ($from) BUILD FAILED: $(grep -m3 error "$A/build-$from.log")"; }
  done
  if [ $built = 1 ]; then
    for from in 1 9; do
      "$A/gemv-check-$from" test >"$A/test-$from.log" 2>&1
      note "gemv tests, GEMV_MMA_FROM=$from: rc=$? $(grep -h '^RESULT' "$A/test-$from.log")"
    done
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$A/gemv-check-1" test >"$A/sanitizer.log" 2>&1
    note "compute-sanitizer memcheck gemv-check (tensor cores at every M): rc=$? $(grep -E 'ERROR SUMMARY' "$A/sanitizer.log" | tail -1)"
    timeout 240 "$A/gemv-check-default" bench >"$A/bench.log" 2>&1
    note "gemv bench: rc=$?"
    grep -h '^RESULT' "$A/bench.log" >>"$SUMMARY"
  fi
fi

# A decode step's launch chain (the small-M kernels and stand-ins for the rest) in a CUDA graph with
# programmatic launch, .gpu/decode-chain-check.cu: step time and read rate, for each batch of
# CHAIN_BATCHES (default "1 8") and each variant of CHAIN_VARIANTS ("name=defines;...", each added
# after GEMV_DEFINES; default: the backend's geometry alone).
if has chain; then
  A=$OUT/chain
  mkdir -p "$A"
  IFS=';' read -ra variants <<<"${CHAIN_VARIANTS:-backend=}"
  for m in ${CHAIN_BATCHES:-1 8}; do
    for v in "${variants[@]}"; do
      name=${v%%=*}
      nvcc -O3 -arch=sm_90a -std=c++17 -I"$G/kernels" -I"$G" -DCHAIN_M=$m $GEMV_DEFINES ${v#*=} $SHAPE_DEFINES "$G/decode-chain-check.cu" -o "$A/chain-$m-$name" >"$A/build-$m-$name.log" 2>&1 &
    done
  done
  wait
  for m in ${CHAIN_BATCHES:-1 8}; do
    for v in "${variants[@]}"; do
      name=${v%%=*}
      if [ -x "$A/chain-$m-$name" ]; then
        timeout 120 "$A/chain-$m-$name" >"$A/run-$m-$name.log" 2>&1
        note "decode chain, batch $m, $name: rc=$?"
        grep -h '^RESULT' "$A/run-$m-$name.log" | sed "s/^RESULT /RESULT [$name] /" >>"$SUMMARY"
        # CHAIN_NCU="name ...": for those variants, where the products' bytes come from (DRAM, L2,
        # L1) and how busy each level is, for one layer's products (ncu profiles each kernel node of
        # the graph on its own).
        if [[ " ${CHAIN_NCU:-} " == *" $name "* ]]; then
          timeout 200 ncu --clock-control none --cache-control none -k regex:gemv --launch-skip 40 --launch-count 4 \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__t_sector_hit_rate.pct,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct \
            "$A/chain-$m-$name" >"$A/ncu-$m-$name.txt" 2>&1
          note "ncu decode chain, batch $m, $name: rc=$?"
          grep -E "gemv_|duration|bytes|throughput|hit_rate|warps_active|stalled" "$A/ncu-$m-$name.txt" | sed "s/^ */  /" >>"$SUMMARY"
        fi
      else
        note "decode-chain-check ($name) BUILD FAILED: $(grep -m3 error "$A/build-$m-$name.log")"
      fi
    done
  done
fi

# Prefill attention alone (kernels/prefill_attention.cu, tensor cores): tests on fresh random data
# for every head configuration below (head_dim multiples of 16 up to 128), compute-sanitizer
# memcheck, and its FLOP rate against cuBLAS's bf16 GEMM rate at 1k, 8k and 32k-token prompts; with
# .gpu/prefill-old.cu present, the same benchmark of that kernel for comparison.
PREFILL_CONFIGS=${PREFILL_CONFIGS:-"8 8 64 0;8 8 128 0;16 8 64 0;16 8 128 0;12 4 128 0;32 8 64 0;32 8 128 0;20 4 128 0;24 4 64 0;28 4 128 0;16 2 64 0;16 2 128 0;64 8 128 0;32 8 128 300;16 2 64 100;4 2 32 0;6 2 16 0;4 2 96 0"}
if has prefillattn; then
  A=$OUT/prefillattn
  mkdir -p "$A"
  # The launch geometry the backend passes (src/backend/cuda/plan.rs: flash_geometry; ATTN_* for
  # attention_reduce): on sm_90a, head_dim a multiple of 64 takes the wgmma kernel (128 rows in two
  # consumer warpgroups and a producer warpgroup, three 128-key stages and the query rows in
  # dynamic shared memory), other head_dims the mma.sync one (64 rows, 32 keys).
  REDUCE_GEOMETRY="$ATTN_GEOMETRY -DATTN_MERGE_SPLITS=8"
  geometry() { # HEAD_DIM [ROWS KEYS WGMMA]: the defines of that geometry
    local wg=${4:-$(( $1 % 64 == 0 ? 1 : 0 ))}
    local rows=${2:-$(( wg ? 128 : 64 ))} keys=${3:-$(( wg ? 128 : 32 ))}
    echo "-DF_WGMMA=$wg -DF_ROWS=$rows -DF_KEYS=$keys -DF_SHARED=$(( wg ? 3 * 2 * keys * $1 * 2 + rows * $1 * 2 + 1024 : 0 )) $REDUCE_GEOMETRY"
  }
  prefill_build() { # NAME SOURCE_DIR Q KV HEAD_DIM WINDOW [EXTRA_NVCC_FLAGS] (HARNESS: another harness)
    nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I"$2" -I"$G/kernels" -DNUM_Q_HEADS=$3 -DNUM_KV_HEADS=$4 -DHEAD_DIM=$5 \
      -DSLIDING_WINDOW=$6 -DKV_BLOCK=16 ${7:-} -Xptxas -v \
      "${HARNESS:-$G/prefill-check.cu}" -lcublas -o "$A/$1" >"$A/$1.build.log" 2>&1 || echo "BUILD FAILED $1: $(grep -m2 error "$A/$1.build.log")" | tee -a "$SUMMARY"
  }
  IFS=';' read -ra PREFILL_LIST <<<"$PREFILL_CONFIGS"
  for cfg in "${PREFILL_LIST[@]}"; do
    set -- $cfg
    prefill_build "prefill-$1-$2-$3-$4" "$G/kernels" "$@" "$(geometry $3)" &
  done
  # The mma.sync kernel on the 8B heads beside the wgmma one, tested and benched.
  prefill_build prefill-mma-32-8-128-0 "$G/kernels" 32 8 128 0 "$(geometry 128 64 32 0)" &
  # PREFILL_VARIANTS: more geometries of the 8B heads to bench beside it, e.g. "128 64 1;64 32 0"
  # (rows, keys, wgmma).
  IFS=';' read -ra VARIANT_LIST <<<"${PREFILL_VARIANTS:-}"
  for variant in "${VARIANT_LIST[@]}"; do
    set -- $variant
    prefill_build "prefill-v$1x$2w$3-32-8-128-0" "$G/kernels" 32 8 128 0 "$(geometry 128 $1 $2 $3)" &
  done
  # PREFILL_DEFINES: named builds of the kernel with extra defines (an experiment behind an #if),
  # each tested on PREFILL_DEFINE_CONFIGS, memchecked and benched (8B heads) beside the default,
  # e.g. "a:-DEXPERIMENT=1;b:-DEXPERIMENT=2".
  IFS=';' read -ra DEFINE_LIST <<<"${PREFILL_DEFINES:-}"
  IFS=';' read -ra DEFINE_CONFIGS <<<"${PREFILL_DEFINE_CONFIGS:-32 8 128 0;64 8 128 0;16 2 64 100;8 8 64 0}"
  for named in "${DEFINE_LIST[@]}"; do
    for cfg in "${DEFINE_CONFIGS[@]}"; do
      set -- $cfg
      prefill_build "prefill-${named%%:*}-$1-$2-$3-$4" "$G/kernels" "$@" "$(geometry $3) ${named#*:}" &
    done
  done
  # A previous kernel and its harness (prefill-old.cu, prefill-check-old.cu) for a side-by-side bench,
  # in PREFILL_OLD_GEOMETRY ("rows keys wgmma"; default the mma.sync one, "64 32 0").
  [ -f "$G/prefill-old.cu" ] && { mkdir -p "$A/old" && cp "$G/prefill-old.cu" "$A/old/prefill_attention.cu" && HARNESS="$G/prefill-check-old.cu" prefill_build prefill-old-32-8-128-0 "$A/old" 32 8 128 0 "$(geometry 128 ${PREFILL_OLD_GEOMETRY:-64 32 0})" & }
  wait
  grep -h -A2 "for prefill_attention" "$A"/prefill-32-8-128-0.build.log "$A"/prefill-mma-32-8-128-0.build.log 2>/dev/null | grep -E "Used|spill" | tee -a "$SUMMARY"
  fails=0
  for cfg in "${PREFILL_LIST[@]}" "32 8 128 0 mma"; do
    set -- $cfg
    [ -n "${5:-}" ] && set -- "mma-$1" "$2" "$3" "$4"
    "$A/prefill-$1-$2-$3-$4" test >"$A/test-$1-$2-$3-$4.log" 2>&1 || fails=$((fails + 1))
    grep -h '^RESULT' "$A/test-$1-$2-$3-$4.log" >>"$SUMMARY" || echo "prefill test $cfg: no result" | tee -a "$SUMMARY"
    grep -h '^MISMATCH' "$A/test-$1-$2-$3-$4.log" | head -3 >>"$SUMMARY"
  done
  note "prefill attention kernel tests: ${#PREFILL_LIST[@]} configurations, $fails failed"
  for named in "${DEFINE_LIST[@]}"; do
    for cfg in "${DEFINE_CONFIGS[@]}"; do
      set -- $cfg
      name="prefill-${named%%:*}-$1-$2-$3-$4"
      "$A/$name" test >"$A/test-$name.log" 2>&1
      note "prefill test $name: rc=$? $(grep -h '^RESULT' "$A/test-$name.log" | tr '\n' ' ')"
      grep -h '^MISMATCH' "$A/test-$name.log" | head -3 >>"$SUMMARY"
    done
    name="prefill-${named%%:*}-32-8-128-0"
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$A/$name" test >"$A/sanitizer-$name.log" 2>&1
    note "compute-sanitizer memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY' "$A/sanitizer-$name.log" | tail -1)"
  done
  for name in prefill-32-8-128-0 prefill-16-2-64-100 prefill-6-2-16-0 prefill-mma-32-8-128-0; do
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$A/$name" test >"$A/sanitizer-$name.log" 2>&1
    note "compute-sanitizer memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY' "$A/sanitizer-$name.log" | tail -1)"
  done
  # PREFILL_BENCH_ROUNDS=N: every build benched N times, in turns (the clock drifts within a call).
  for round in $(seq 1 "${PREFILL_BENCH_ROUNDS:-1}"); do
  for name in prefill-32-8-128-0 $(for named in "${DEFINE_LIST[@]}"; do echo "prefill-${named%%:*}-32-8-128-0"; done) prefill-mma-32-8-128-0 prefill-old-32-8-128-0 $(for v in "${VARIANT_LIST[@]}"; do set -- $v; echo "prefill-v$1x$2w$3-32-8-128-0"; done) prefill-64-8-128-0 prefill-32-8-64-0; do
    [ -x "$A/$name" ] || continue
    timeout 240 "$A/$name" bench >"$A/bench-$name-$round.log" 2>&1
    note "prefill bench $name (round $round): rc=$?"
    grep -h '^RESULT' "$A/bench-$name-$round.log" | sed "s/^/$name r$round /" >>"$SUMMARY"
  done
  done
  # PREFILL_NCU=1: ncu of one launch of the 8k prompt (the bench's 31st launch) per kernel built
  # (PREFILL_NCU_NAMES: which builds; PREFILL_NCU_EXTRA: more ncu flags), its pipes' use first.
  if [ "${PREFILL_NCU:-0}" = 1 ]; then
    for name in ${PREFILL_NCU_NAMES:-prefill-32-8-128-0 prefill-mma-32-8-128-0}; do
      [ -x "$A/$name" ] || continue
      timeout 200 ncu --clock-control none -k prefill_attention --launch-skip 30 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis ${PREFILL_NCU_EXTRA:-} \
        --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
        "$A/$name" bench >"$A/ncu-$name.txt" 2>&1
      note "ncu $name: rc=$?"
      grep -E "^ +(sm__|smsp__)" "$A/ncu-$name.txt" | sed "s/^/  $name /" >>"$SUMMARY"
      # PREFILL_NCU_SASS=1: the 40 SASS instructions with the most stall samples, and their reasons.
      if [ "${PREFILL_NCU_SASS:-0}" = 1 ]; then
        timeout 200 ncu --clock-control none -k prefill_attention --launch-skip 30 --launch-count 1 --section SourceCounters \
          --section WarpStateStats -f -o "$A/sass-$name" "$A/$name" bench >/dev/null 2>&1
        ncu -i "$A/sass-$name.ncu-rep" --page source --csv --print-source sass >"$A/sass-$name.csv" 2>&1
        python3 - "$A/sass-$name.csv" <<'PY' >>"$SUMMARY" 2>&1
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Source" in r)
names = rows[head]
col = lambda key: next(i for i, n in enumerate(names) if n.startswith(key))
src, samples = col("Source"), col("Warp Stall Sampling (All")
stall_cols = [i for i, n in enumerate(names) if n.startswith("stall_") and "Not Issued" not in n]
body = [r for r in rows[head + 1:] if len(r) == len(names)]
num = lambda v: float(v.replace(",", "") or 0)
total = sum(num(r[samples]) for r in body)
print(f"  SASS hot spots ({total:.0f} samples)")
for r in sorted(body, key=lambda r: -num(r[samples]))[:40]:
    top = sorted(((num(r[i]), names[i]) for i in stall_cols), reverse=True)[:3]
    print(f"  {100 * num(r[samples]) / total:5.1f}% {r[src][:70]:70s} " + " ".join(f"{n[6:]}={v:.0f}" for v, n in top if v))
PY
      fi
      grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|Shared Memory|Executed Ipc|L1/TEX Hit|Bank" "$A/ncu-$name.txt" | head -40 | sed "s/^/  /" >>"$SUMMARY"
    done
  fi
  grep -h -A2 "for prefill_attention" "$A"/prefill-v*.build.log $(for named in "${DEFINE_LIST[@]}"; do echo "$A/prefill-${named%%:*}-32-8-128-0.build.log"; done) 2>/dev/null | grep -E "Used|spill" >>"$SUMMARY"
  # ptxas serialises every wgmma of a kernel it cannot keep asynchronous (C7510-C7520): a silent
  # halving of the warpgroup kernel's rate, so each build that reports it is named.
  for log in "$A"/prefill-*.build.log; do
    grep -q "wgmma.mma_async instructions are serialized" "$log" && note "ptxas serialised the products: $(basename "$log" .build.log): $(grep -o 'C75[0-9]*' "$log" | sort -u | tr '\n' ' ')"
  done
fi

M8=/tmp/llama8b
if has bench || has quickbench || has peers || has serve || has ohttp || has graphs || has prefill || has sealedstart || has profile; then
  PYTHONUNBUFFERED=1 python3 "$G/make_llama8b.py" $M8 >"$OUT/make8b.log" 2>&1
  note "8B-shaped weights: $(tail -1 "$OUT/make8b.log")"
fi

SPECS=${SPECS:-"1 128 128;1 1024 128;16 128 128;64 128 128;64 1024 128"}
has quickbench && SPECS="16 128 128"
if has bench || has quickbench; then
  IFS=';' read -ra SPEC_LIST <<<"$SPECS"
  # BENCH_BINS: the builds to run every spec with, in turn (default: .gpu/inferno alone), e.g.
  # "inferno inferno-base" for a side-by-side run of two builds.
  for spec in "${SPEC_LIST[@]}"; do
    for bin in ${BENCH_BINS:-inferno}; do
      # "batch input output [extra bench flags]", e.g. "64 1000 256 --itl-stall-limit 0"; a batch
      # written cN runs a closed loop of N in flight instead ("c256 1000 1000 --num-prompts 1024").
      set -- $spec
      b=$1 i=$2 o=$3
      shift 3
      load=(--batch-size "$b")
      [[ $b == c* ]] && load=(--concurrency "${b#c}")
      tag=$(echo "$bin $*" | tr -c 'a-z0-9' '_')
      timeout 240 $RUN "$G/$bin" bench offline --model $M8 --device cuda "${load[@]}" --input-len "$i" --output-len "$o" \
        --ignore-eos "$@" --json "$OUT/bench-b$b-i$i$tag.json" >"$OUT/bench-b$b-i$i$tag.log" 2>&1
      rc=$?
      cat "$OUT/bench-b$b-i$i$tag.log" >>"$OUT/bench.log"
      note "$bin offline batch=$b in=$i out=$o $*: rc=$rc $(grep -E '^output throughput' "$OUT/bench-b$b-i$i$tag.log" | tail -1)"
      grep -E '^(TTFT|ITL|engine steps) ' "$OUT/bench-b$b-i$i$tag.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    done
  done
  grep -E 'CUDA backend ready|KV cache allocated|kernels ready' "$OUT/bench.log" | head -4 >>"$SUMMARY"
fi

# FP8 (issue 43): the FP8 kernels alone (.gpu/fp8-check.cu: every small-M launch geometry tested
# and timed on the 8B shapes), the FP8 projections against the CPU backend's FP8 reference and
# against PyTorch's (.gpu/fp8_reference.py; tests/cuda_fp8.rs: the published forms and the bf16
# fixtures quantized at load, 512 positions teacher-forced, the bf16 path against PyTorch's bf16
# beside them), compute-sanitizer memcheck over the FP8 kernels (fewer positions), and the
# 8B-shaped weights quantized at load against bf16 in the same run: FP8_SPECS (default batch 1 at
# 1000/256, the 8k prompt's TTFT at batch 1, batch 64 at 1000/256, concurrency 256 at 1000/1000
# over FP8_C256_PROMPTS prompts),
# with the batch-1 inter-token latency set against the FP8 weight-read floor (the bytes a decode
# step reads: every projection in E4M3, the LM head in bf16, at the 3.0 TB/s copy rate).
if has fp8; then
  # FP8_SKIP_CHECKS=1: the benches alone.
  if [ -z "${FP8_SKIP_CHECKS:-}" ]; then
    F=$OUT/fp8
    mkdir -p "$F"
    # The kernels alone (.gpu/fp8-check.cu): tests, memcheck, the decode products' read rate;
    # and a decode step's FP8 launch chain in a CUDA graph (chain mode) at batch 1 and 8, and at
    # batch 1 with the weights loaded after the wait for the previous kernel (FP8_EARLY_WEIGHTS=0);
    # a prefill chunk's products by cuBLASLt in bf16 and E4M3 (gemm mode).
    fp8_build() { # NAME DEFINES...
      local name=$1
      shift
      timeout 300 nvcc -O3 -arch=sm_90a -std=c++17 -I"$G/kernels" -I"$G" $SHAPE_DEFINES "$@" -Xptxas -v "$G/fp8-check.cu" -lcublasLt -o "$F/$name" >"$F/build-$name.log" 2>&1 ||
        note "$name BUILD FAILED: $(grep -m3 error "$F/build-$name.log")"
    }
    fp8_build fp8-check &
    fp8_build fp8-chain-1 -DCHAIN_M=1 &
    fp8_build fp8-chain-1-late -DCHAIN_M=1 -DFP8_EARLY_WEIGHTS=0 &
    fp8_build fp8-chain-8 -DCHAIN_M=8 &
    wait
    for chain in fp8-chain-1 fp8-chain-1-late fp8-chain-8; do
      [ -x "$F/$chain" ] && timeout 60 "$F/$chain" chain >"$F/$chain.log" 2>&1
      note "$chain: rc=$? $(grep -h '^RESULT fp8 decode' "$F/$chain.log" | tr '\n' ' ')"
    done
    if [ -x "$F/fp8-check" ]; then
      timeout 120 "$F/fp8-check" test >"$F/test.log" 2>&1
      note "fp8 kernel tests: rc=$? $(grep -h '^RESULT' "$F/test.log" | tr '\n' ' ')"
      # FP8_SANITIZE=0: no compute-sanitizer runs (a quick call); kernels: this one alone (with
      # fewer M and geometries in the fused entries' tests: FP8_CHECK_QUICK).
      if [ "${FP8_SANITIZE:-1}" != 0 ]; then
        FP8_CHECK_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$F/fp8-check" test >"$F/sanitizer.log" 2>&1
        note "compute-sanitizer memcheck fp8-check: rc=$? $(grep -E 'ERROR SUMMARY' "$F/sanitizer.log" | tail -1)"
      fi
      # FP8_KERNEL_BENCH=0: not every small-M geometry timed (the chain above is the step's figure).
      if [ "${FP8_KERNEL_BENCH:-1}" != 0 ]; then
        timeout 120 "$F/fp8-check" bench >"$F/bench.log" 2>&1
        note "fp8 kernel bench: rc=$?"
        grep -h '^RESULT' "$F/bench.log" >>"$SUMMARY"
      fi
      # A prefill chunk's products by cuBLASLt, bf16 against E4M3 (the bound on the TTFT ratio).
      FP8_GEMM_M=${FP8_GEMM_M:-2048} timeout 120 "$F/fp8-check" gemm >"$F/gemm.log" 2>&1
      note "fp8 prefill products (fp8-check gemm): rc=$?"
      grep -h '^RESULT' "$F/gemm.log" >>"$SUMMARY"
    fi
    # PyTorch's teacher-forced logits of the same models (.gpu/fp8_reference.py), which
    # tests/cuda_fp8.rs compares the CUDA and CPU backends with (INFERNO_FP8_TORCH; the logits
    # stay out of $OUT: 2 MB a model and variant).
    # FP8_TORCH=0: no PyTorch reference, the CUDA backend against the CPU backend's alone.
    fp8_tests=()
    if [ "${FP8_TORCH:-1}" != 0 ]; then
      timeout 180 python3 "$G/fp8_reference.py" "$INFERNO_FIXTURES" /tmp/fp8-torch "${INFERNO_FP8_POSITIONS:-512}" >"$F/torch.log" 2>&1
      note "fp8 torch reference (.gpu/fp8_reference.py): rc=$? $(grep -c '^RESULT' "$F/torch.log") logit files $(grep -m2 -E 'Error|error' "$F/torch.log")"
    else
      fp8_tests=(fp8_teacher_forced_logits_match_the_cpu_reference)
    fi
    INFERNO_FP8_TORCH=/tmp/fp8-torch timeout 300 $RUN "$G/cuda_fp8" --include-ignored --test-threads=1 --nocapture "${fp8_tests[@]}" >"$OUT/fp8.log" 2>&1
    note "fp8 correctness (tests/cuda_fp8.rs): rc=$? $(grep -E '^test result' "$OUT/fp8.log")"
    grep -E '^RESULT|panicked' "$OUT/fp8.log" | head -60 | tee -a "$SUMMARY"
    if [ "${FP8_SANITIZE:-1}" = 1 ]; then
      INFERNO_FP8_MODELS=${FP8_SANITIZE_MODELS:-block,inferno-tiny} INFERNO_FP8_POSITIONS=64 timeout 300 $RUN compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
        "$G/cuda_fp8" --include-ignored --test-threads=1 fp8_teacher_forced_logits_match_the_cpu_reference >"$OUT/fp8-sanitizer.log" 2>&1
      note "compute-sanitizer memcheck (tests/cuda_fp8.rs, ${FP8_SANITIZE_MODELS:-block,inferno-tiny}, 64 positions): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/fp8-sanitizer.log" | tail -1)"
    fi
  fi
  [ -d $M8 ] || PYTHONUNBUFFERED=1 python3 "$G/make_llama8b.py" $M8 >"$OUT/make8b.log" 2>&1
  # "1 8192 4": the 8k prompt on an idle engine, whose TTFT the issue bounds at 0.6 x bf16's.
  # Concurrency 256 at 1000/1000 runs with the FP8 KV cache in both arms: with a bf16 cache its
  # decode steps read about 50 GB of keys and values (256 rows x 1,500 positions x 128 KiB), 16 ms
  # at 3.0 TB/s, more than the 16.5 ms a step may take for 15,500 tok/s, whatever the weights.
  FP8_SPECS=${FP8_SPECS:-"1 1000 256;1 8192 4;64 1000 256;c256 1000 1000 --num-prompts ${FP8_C256_PROMPTS:-1024} --kv-cache-dtype fp8"}
  IFS=';' read -ra FP8_LIST <<<"$FP8_SPECS"
  for spec in "${FP8_LIST[@]}"; do
    for arm in bf16 fp8; do
      set -- $spec
      b=$1 i=$2 o=$3
      shift 3
      load=(--batch-size "$b")
      [[ $b == c* ]] && load=(--concurrency "${b#c}")
      quant=()
      [ $arm = fp8 ] && quant=(--quantization fp8)
      log="$OUT/fp8-bench-$arm-b$b-i$i-o$o.log"
      timeout ${FP8_BENCH_TIMEOUT:-300} $RUN "$G/inferno" bench offline --model $M8 --device cuda "${load[@]}" --input-len "$i" \
        --output-len "$o" --ignore-eos "${quant[@]}" "$@" --json "${log%.log}.json" >"$log" 2>&1
      note "fp8 stage: $arm offline batch=$b in=$i out=$o $*: rc=$? $(grep -E '^output throughput' "$log" | tail -1)"
      grep -E '^(TTFT|ITL|engine steps) ' "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
      grep -E 'FP8 product is not available|weights uploaded' "$log" | head -2 | sed 's/^/    /' >>"$SUMMARY"
    done
  done
  python3 - "$M8" <<'PY' | tee -a "$SUMMARY"
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
h, i, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
d = c.get("head_dim", h // c["num_attention_heads"])
q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
fp8 = L * (h * (q + 2 * kv) + q * h + 3 * h * i)
head = v * h * 2
floor_ms = (fp8 + head) / 3.0e12 * 1e3
print(f"FP8 weight-read floor: {(fp8 + head) / 1e9:.2f} GB per decode step ({fp8 / 1e9:.2f} GB E4M3 projections, {head / 1e9:.2f} GB bf16 LM head): {floor_ms:.3f} ms at 3.0 TB/s, {1e3 / floor_ms:.0f} tok/s at batch 1")
PY
fi

# The sampling kernel alone at 128,256 ids (.gpu/sampling-check.cu built with nvcc): its draws over
# fixed rows in seven modes, compared byte for byte with .gpu/sampling-old.cu's where that file
# is there, compute-sanitizer memcheck and racecheck, and microseconds per launch by rows and mode.
if has sampling; then
  S=$OUT/sampling
  mkdir -p "$S"
  sampling_build() { # NAME SOURCE_DIR
    nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I"$2" -I"$G/kernels" -DVOCAB=128256 -Xptxas -v \
      "$G/sampling-check.cu" -o "$S/$1" >"$S/$1.build.log" 2>&1 || echo "BUILD FAILED $1" | tee -a "$SUMMARY"
  }
  sampling_build sampling-new "$G/kernels" &
  [ -f "$G/sampling-old.cu" ] && { mkdir -p "$S/old" && cp "$G/sampling-old.cu" "$S/old/sampling.cu" && sampling_build sampling-old "$S/old" & }
  wait
  grep -h -A2 "for sample_tokens" "$S"/sampling-new.build.log | grep -E "Used|spill" | tee -a "$SUMMARY"
  for b in sampling-new sampling-old; do
    [ -x "$S/$b" ] || continue
    "$S/$b" draws "$S/$b.draws" >"$S/$b-draws.log" 2>&1
    note "sampling draws $b: rc=$? $(grep -h RESULT "$S/$b-draws.log")"
  done
  if [ -f "$S/sampling-old.draws" ]; then
    if cmp -s "$S/sampling-new.draws" "$S/sampling-old.draws"; then
      note "sampling draws: the new and the old kernel wrote the same bytes"
    else
      note "sampling draws: DIFFERENT outputs, new against old ($(cmp -l "$S/sampling-new.draws" "$S/sampling-old.draws" | wc -l) bytes)"
    fi
  fi
  for tool in memcheck racecheck; do
    timeout 180 compute-sanitizer --tool $tool --error-exitcode 3 "$S/sampling-new" draws "$S/$tool.draws" >"$S/$tool.log" 2>&1
    note "compute-sanitizer $tool sampling-new draws: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$S/$tool.log" | tail -1)"
  done
  for b in sampling-new sampling-old; do
    [ -x "$S/$b" ] || continue
    timeout 120 "$S/$b" bench >"$S/$b-bench.log" 2>&1
    note "sampling bench $b: rc=$?"
    grep -h '^RESULT' "$S/$b-bench.log" | sed "s/^/$b /" >>"$SUMMARY"
  done
fi

# Where a step goes (PROFILE_LOAD: the bench's load, default batch PROFILE_BATCH (1) of 1,000-token
# prompts and PROFILE_OUTPUT (64) output tokens; PROFILE_FLAGS more bench flags, e.g.
# "--itl-stall-limit 0"; PROFILE_SKIP launches skipped, past the prefill or into a steady state):
# ncu times every kernel of a range of launches (eager, so each kernel is its own launch), then
# the whole steps in it (from embedding_gather to sample_tokens) are summed per kernel: decode
# steps (paged_attention, no prefill kernel) and steps with a prefill kernel apart (their grids
# printed: tiles x KV heads x splits).
if has profile; then
  timeout 400 $RUN ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
    --launch-skip ${PROFILE_SKIP:-2000} --launch-count ${PROFILE_COUNT:-1400} \
    "$G/inferno" bench offline --model $M8 --device cuda \
    ${PROFILE_LOAD:---batch-size ${PROFILE_BATCH:-1} --input-len 1000 --output-len ${PROFILE_OUTPUT:-64}} \
    --ignore-eos --no-cuda-graphs ${PROFILE_FLAGS:-} >"$OUT/profile.csv" 2>"$OUT/profile.log"
  note "ncu profile (${PROFILE_LOAD:-batch ${PROFILE_BATCH:-1}}): rc=$?"
  python3 - "$OUT/profile.csv" <<'PY' | tee -a "$SUMMARY"
import csv, sys, collections
launches = {}  # launch ID -> [name, grid, {metric: value}]
for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')):
    launch = launches.setdefault(r["ID"], [r["Kernel Name"].split("(")[0], r.get("Grid Size", ""), {}])
    launch[2][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
steps, current = [], []
for name, grid, m in launches.values():
    if name == "embedding_gather" and current:
        steps.append(current)
        current = []
    # (name, microseconds, grid, DRAM bytes read)
    current.append((name, m.get("gpu__time_duration.sum", 0.0) / 1e3, grid, m.get("dram__bytes_read.sum", 0.0)))
whole = [s for s in steps if s[0][0] == "embedding_gather" and s[-1][0] == "sample_tokens"]
kinds = {
    "decode": [s for s in whole if any(n == "paged_attention" for n, *_ in s) and not any("prefill" in n for n, *_ in s)],
    "mixed": [s for s in whole if any("prefill" in n for n, *_ in s)],
}
if not any(kinds.values()):
    sys.exit("no whole step in the profiled range")
for kind, chosen in kinds.items():
    if not chosen:
        continue
    per = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for s in chosen:
        for n, us, _, read in s:
            per[n][0] += 1
            per[n][1] += us
            per[n][2] += read
    total = sum(v[1] for v in per.values()) / len(chosen)
    grids = sorted({g for s in chosen for n, _, g, _ in s if "prefill" in n})
    print(f"RESULT profile: {len(chosen)} {kind} steps, {len(chosen[0])} kernels and {total:.0f} us of kernel time per step"
          + (f"; prefill grids {' '.join(grids)}" if grids else ""))
    for n, (calls, us, read) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"RESULT profile   {kind:6s} {n[:54]:54s} {calls / len(chosen):6.1f} per step {us / calls:8.2f} us each {us / len(chosen):8.1f} us per step"
              f" {read / us / 1e3 if us else 0:6.0f} GB/s read")
PY
fi

if has graphs; then
  for b in 1 16 64; do
    for mode in on off; do
      flag=""; [ $mode = off ] && flag="--no-cuda-graphs"
      timeout 240 $RUN "$G/inferno" bench offline --model $M8 --device cuda --batch-size $b --input-len 128 --output-len 128 \
        --ignore-eos $flag --json "$OUT/graphs-$mode-b$b.json" >"$OUT/graphs-$mode-b$b.log" 2>&1
      note "graphs $mode batch=$b in=128 out=128: rc=$? $(grep -E '^output throughput' "$OUT/graphs-$mode-b$b.log" | tail -1) | $(grep -E '^TPOT' "$OUT/graphs-$mode-b$b.log" | tail -1) | $(grep -E '^CPU time' "$OUT/graphs-$mode-b$b.log" | tail -1)"
    done
  done
  grep -hE 'decode graphs captured|CUDA backend ready' "$OUT/graphs-on-b64.log" | head -2 >>"$SUMMARY"
fi

if has prefill; then
  for in_len in 1024 2048; do
    timeout 240 $RUN "$G/inferno" bench offline --model $M8 --device cuda --batch-size 16 --input-len $in_len --output-len 16 \
      --ignore-eos --json "$OUT/prefill-i$in_len.json" >"$OUT/prefill-i$in_len.log" 2>&1
    note "prefill batch=16 in=$in_len out=16: rc=$? $(grep -E '^duration' "$OUT/prefill-i$in_len.log" | tail -1) | $(grep -E '^TTFT' "$OUT/prefill-i$in_len.log" | tail -1)"
  done
  grep -hE 'weights uploaded' "$OUT/prefill-i1024.log" | head -1 >>"$SUMMARY"
fi

if has serve; then
  # SERVE_ENV: extra environment for the server only, e.g. CUDA_MODULE_LOADING=EAGER.
  # SERVE_ENGINES: '|'-separated server variants, one fresh server per variant, in order, each
  # running every run of SERVE_RUNS. A variant is "ENV@ENGINE": environment assignments for that
  # server (added to SERVE_ENV) and an [engine] setting (e.g. "@cuda_mixed_graphs = false" or
  # "CUDA_MODULE_LOADING=EAGER@"); an empty variant runs the defaults without a config file.
  # SERVER_BIN=NAME among a variant's assignments serves with .gpu/NAME instead of .gpu/inferno
  # (another build, e.g. "SERVER_BIN=inferno-base@", for a side-by-side run).
  SERVE_RUNS=${SERVE_RUNS:-"--concurrency 16 --num-prompts 64 --input-len 128 --output-len 128;--rate 8 --num-prompts 64 --input-len 128 --output-len 128"}
  IFS=';' read -ra SERVE_LIST <<<"$SERVE_RUNS"
  IFS='|' read -ra ENGINE_LIST <<<"${SERVE_ENGINES:-}"
  [ ${#ENGINE_LIST[@]} -eq 0 ] && ENGINE_LIST=("")
  n=0
  v=0
  for variant in "${ENGINE_LIST[@]}"; do
    v=$((v + 1))
    variant_env=""
    engine=$variant
    if [[ $variant == *@* ]]; then
      variant_env=${variant%%@*}
      engine=${variant#*@}
    fi
    server_bin="$G/inferno"
    for assignment in $variant_env; do
      [[ $assignment == SERVER_BIN=* ]] && server_bin="$G/${assignment#SERVER_BIN=}"
    done
    config_args=()
    if [ -n "$engine" ]; then
      printf '[attestation]\nprofile = "development"\n[engine]\n%s\n' "$engine" >"$OUT/serve-engine-$v.toml"
      config_args=(--config "$OUT/serve-engine-$v.toml")
    fi
    note "serve variant $v: $(basename "$server_bin"); server environment: ${SERVE_ENV:-} ${variant_env:-}; engine: ${engine:-(defaults)}"
    RUST_LOG=${SERVE_LOG:-warn,inferno::cli::startup=info,inferno::backend=info} $RUN ${SERVE_ENV:-} $variant_env "$server_bin" serve "${config_args[@]}" --model $M8 --device cuda --listen 127.0.0.1:8443 >"$OUT/serve-$v.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 120); do
      curl -ksf https://127.0.0.1:8443/health >/dev/null 2>&1 && break
      sleep 1
    done
    grep -hE 'start-up timeline' "$OUT/serve-$v.log" | tail -1 | sed 's/^/    /' | tee -a "$SUMMARY"
    # Runs in order on one server (the first run after start shows first-use costs).
    r=0
    for args in "${SERVE_LIST[@]}"; do
      n=$((n + 1))
      r=$((r + 1))
      # Fresh prompts in every run unless it names its seed: the server keeps earlier runs'
      # prompts in its prefix cache.
      [[ " $args " == *" --seed "* ]] || args="$args --seed $r"
      timeout 240 $RUN "$G/inferno" bench serve --url https://127.0.0.1:8443 --model llama8b --insecure \
        $args --ignore-eos --server-pid $SERVER \
        --json "$OUT/serve-$n.json" >"$OUT/serve-bench-$n.log" 2>&1
      rc=$?
      cat "$OUT/serve-bench-$n.log" >>"$OUT/serve-bench.log"
      note "inferno serve variant $v run $r ($args): rc=$rc $(grep -E '^output throughput' "$OUT/serve-bench-$n.log" | tail -1)"
      grep -E '^(TTFT|ITL) |^CPU |^  [a-z]+ threads|^    engine |^long prompt' "$OUT/serve-bench-$n.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    done
    kill -TERM $SERVER 2>/dev/null
    wait $SERVER 2>/dev/null
  done
fi

# Oblivious HTTP (issue 50): the same load over attested TLS and over OHTTP in one run, each
# through its local proxy (`inferno proxy` and `inferno proxy --ohttp`) against one server of the
# 8B-shaped model: concurrency 64, 1000 prompt and 256 output tokens, TLS and OHTTP alternating
# (OHTTP_ROUNDS times each). Output throughput and TTFT side by side, and the server's CPU time
# per output token: the difference is the gateway's sealing cost per streamed token. Targets:
# OHTTP costs <= 3% of output throughput and <= 1 ms of TTFT; <= 0.05 ms CPU per token.
if has ohttp; then
  OHTTP_LOAD=${OHTTP_LOAD:-"--concurrency 64 --num-prompts 256 --input-len 1000 --output-len 256"}
  RUST_LOG=${SERVE_LOG:-warn} $RUN "$G/inferno" serve --model $M8 --device cuda --listen 127.0.0.1:8443 >"$OUT/ohttp-serve.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 180); do
    curl -ksf https://127.0.0.1:8443/health >/dev/null 2>&1 && break
    sleep 1
  done
  RUST_LOG=warn $RUN "$G/inferno" proxy --listen 127.0.0.1:8081 --upstream https://127.0.0.1:8443 \
    --policy policy/client-development.toml >"$OUT/ohttp-proxy-tls.log" 2>&1 &
  PROXY_TLS=$!
  RUST_LOG=warn $RUN "$G/inferno" proxy --ohttp --listen 127.0.0.1:8082 --upstream https://127.0.0.1:8443 \
    --policy policy/client-development.toml >"$OUT/ohttp-proxy-ohttp.log" 2>&1 &
  PROXY_OHTTP=$!
  sleep 2
  for round in $(seq 1 "${OHTTP_ROUNDS:-2}"); do
    for path in tls:8081 ohttp:8082; do
      name=${path%%:*}
      port=${path##*:}
      timeout 300 $RUN "$G/inferno" bench serve --url http://127.0.0.1:$port --model llama8b \
        $OHTTP_LOAD --ignore-eos --seed $((round * 10 + port)) --server-pid $SERVER \
        --json "$OUT/ohttp-$name-$round.json" >"$OUT/ohttp-$name-$round.log" 2>&1
      rc=$?
      note "ohttp round $round over $name: rc=$rc $(grep -E '^output throughput' "$OUT/ohttp-$name-$round.log" | tail -1)"
      grep -E '^TTFT |^CPU ' "$OUT/ohttp-$name-$round.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    done
  done
  kill -TERM $PROXY_TLS $PROXY_OHTTP $SERVER 2>/dev/null
  wait $PROXY_TLS $PROXY_OHTTP $SERVER 2>/dev/null
fi

# Constrained decoding (issue 16). Grammar masks and logit_bias are applied by the device
# sampler from the step's one packed copy (the cuda_backend test
# device_sampler_applies_masks_and_logit_bias_like_the_reference checks that, in stage
# `correctness`). Here: CPU and CUDA servers of the embedded model give the same greedy
# constrained outputs (a difference must be a near-tie: both backends' teacher-forced margins
# between the two candidate tokens within 0.1, else rc=1), then JSON-schema-constrained vs free
# output throughput (streamed /v1/completions) of the 8B-shaped weights with a byte-level
# tokenizer at batch 1 and 64 (alternating rounds, medians, ratio; equal token counts in both
# arms, else rc=1; decode ms per token; the engine's mask wait per step from /metrics; target
# cost <= 5%). Needs only the release binary, constrained_check.py and make_llama8b.py (python3
# with torch + safetensors).
if has constrained; then
  # Development profile (simulated TEE) as without a config; the embedded model's template shows
  # no tool-call markers, so the format is named for the tool_required case.
  printf '[attestation]\nprofile = "development"\n[server]\ntool_call_parser = "hermes"\n' >/tmp/constrained-dev.toml
  serve_on() { # DEVICE PORT [MODEL_ARGS...]
    local device=$1 port=$2; shift 2
    RUST_LOG=warn $RUN "$G/inferno" serve --config /tmp/constrained-dev.toml "$@" --device "$device" --listen 127.0.0.1:$port >"$OUT/serve-$device-$port.log" 2>&1 &
    echo $!
  }
  wait_up() { # PORT PID
    for _ in $(seq 1 240); do
      curl -ksf "https://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
      kill -0 "$2" 2>/dev/null || break
      sleep 1
    done
    note "constrained: the server on port $1 did not come up: $(tail -3 "$OUT"/serve-*-"$1".log | tr '\n' ' ')"
    return 1
  }
  CPU_PID=$(serve_on cpu 8450)
  GPU_PID=$(serve_on cuda 8451)
  if wait_up 8450 "$CPU_PID" && wait_up 8451 "$GPU_PID"; then
    timeout 300 python3 "$G/constrained_check.py" compare https://127.0.0.1:8450 https://127.0.0.1:8451 inferno-tiny >"$OUT/constrained-compare.log" 2>&1
    note "constrained compare (embedded model, CPU vs CUDA): rc=$?"
    grep -E '^RESULT|Error' "$OUT/constrained-compare.log" | tee -a "$SUMMARY"
  fi
  kill -TERM "$CPU_PID" "$GPU_PID" 2>/dev/null; wait "$CPU_PID" "$GPU_PID" 2>/dev/null
  [ -d $M8 ] || PYTHONUNBUFFERED=1 python3 "$G/make_llama8b.py" $M8 >"$OUT/make8b.log" 2>&1
  # The 8B-shaped model's word-level tokenizer has no JSON characters: the same weights with a
  # synthetic byte-level tokenizer of the same size.
  M8B=/tmp/llama8b-bytes
  python3 "$G/constrained_check.py" byte-tokenizer $M8 $M8B >"$OUT/constrained-tokenizer.log" 2>&1
  note "constrained: $(tail -1 "$OUT/constrained-tokenizer.log")"
  B8_PID=$(serve_on cuda 8452 --model $M8B)
  if wait_up 8452 "$B8_PID"; then
    timeout 400 python3 "$G/constrained_check.py" bench https://127.0.0.1:8452 llama8b-bytes 1 64 --rounds 3 --tokens 128 >"$OUT/constrained-bench.log" 2>&1
    note "constrained bench (8B-shaped, CUDA): rc=$?"
    grep -E '^RESULT |Error' "$OUT/constrained-bench.log" | tee -a "$SUMMARY"
    sed -n 's/^RESULT_JSON //p' "$OUT/constrained-bench.log" >"$OUT/constrained-bench.json"
  fi
  kill -TERM "$B8_PID" 2>/dev/null; wait "$B8_PID" 2>/dev/null
fi

# Issue 46. Both stages use a Qwen3-Embedding-8B-shaped model with random weights and the real
# Qwen3 tokenizer (make_llama8b.py --qwen3-embedding; .gpu/qwen3-tokenizer.tar.xz from
# gpu-pack.sh): tensors named as Qwen3-Embedding publishes them, sentence-transformers files,
# the embedding matrix tied to an LM head so that the same weights also generate.
#   embed: CPU and CUDA servers of tests/fixtures/tiny-qwen3-embedding (and of its published
#     layout) agree on /v1/embeddings (cosine >= 0.999, .gpu/embed_check.py); then `bench offline`
#     of 256 prompts of 512 tokens on the 8B-shaped model, as embedding requests and as a prefill
#     with 1 output token, alternating EMBED_ROUNDS times (default 1); target ratio <= 1.2.
#   constrainedqwen: constrained_check.py's JSON-schema-constrained vs free throughput at batch
#     64 (CONSTRAINED_QWEN_BATCHES) on the same model, whose tokenizer has 151,669 tokens
#     (vocab 151936); target cost <= 5%. CONSTRAINED_QWEN_OFFLINE=1 adds `bench offline` of both
#     arms (--json-schema scripts/bench-notes-schema.json): the engine's host work per step.
Q8=/tmp/qwen3-8b-embedding
make_q8() {
  [ -f $Q8/model.safetensors.index.json ] && return 0
  mkdir -p /tmp/qwen3-tokenizer && tar -xJf "$G/qwen3-tokenizer.tar.xz" -C /tmp/qwen3-tokenizer
  PYTHONUNBUFFERED=1 timeout 400 python3 "$G/make_llama8b.py" --qwen3-embedding /tmp/qwen3-tokenizer $Q8 >"$OUT/make-qwen3-8b.log" 2>&1
  note "qwen3-8b-embedding: $(tail -1 "$OUT/make-qwen3-8b.log")"
}
serve46() { # DEVICE PORT MODEL_DIR
  printf '[attestation]\nprofile = "development"\n' >/tmp/dev46.toml
  RUST_LOG=warn $RUN "$G/inferno" serve --config /tmp/dev46.toml --model "$3" --device "$1" --listen 127.0.0.1:$2 >"$OUT/serve46-$1-$2.log" 2>&1 &
  echo $!
}
up46() { # PORT PID
  for _ in $(seq 1 240); do
    curl -ksf "https://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 1
  done
  note "issue 46: the server on port $1 did not come up: $(tail -3 "$OUT"/serve46-*-"$1".log | tr '\n' ' ')"
  return 1
}
if has embed; then
  for fixture in tiny-qwen3-embedding tiny-qwen3-embedding-published; do
    CPU46=$(serve46 cpu 8460 "$PWD/tests/fixtures/$fixture")
    GPU46=$(serve46 cuda 8461 "$PWD/tests/fixtures/$fixture")
    if up46 8460 "$CPU46" && up46 8461 "$GPU46"; then
      timeout 120 python3 "$G/embed_check.py" compare https://127.0.0.1:8460 https://127.0.0.1:8461 >"$OUT/embed-compare-$fixture.log" 2>&1
      note "embed compare ($fixture, CPU vs CUDA): rc=$? $(grep -E '^RESULT|Error' "$OUT/embed-compare-$fixture.log" | head -3)"
    fi
    kill -TERM "$CPU46" "$GPU46" 2>/dev/null; wait "$CPU46" "$GPU46" 2>/dev/null
  done
  make_q8
  prefill=() embeds=()
  for round in $(seq 1 "${EMBED_ROUNDS:-1}"); do
    for kind in prefill embed; do
      args=(--model $Q8 --device cuda --batch-size 256 --input-len 512 --output-len 1 --ignore-eos --json "$OUT/embed-$kind-$round.json")
      [ $kind = embed ] && args+=(--embeddings)
      timeout 300 $RUN "$G/inferno" bench offline "${args[@]}" >"$OUT/embed-$kind-$round.log" 2>&1
      note "embed bench $kind round $round: rc=$? $(grep -E '^(requests|duration) ' "$OUT/embed-$kind-$round.log" | head -2 | tr '\n' ' ')"
      [ -f "$OUT/embed-$kind-$round.json" ] && { [ $kind = embed ] && embeds+=("$OUT/embed-$kind-$round.json") || prefill+=("$OUT/embed-$kind-$round.json"); }
    done
  done
  if [ ${#prefill[@]} -gt 0 ] && [ ${#embeds[@]} -gt 0 ]; then
    python3 "$G/embed_check.py" ratio "${prefill[@]}" -- "${embeds[@]}" >"$OUT/embed-ratio.log" 2>&1
    note "embed ratio: rc=$? $(grep '^RESULT ' "$OUT/embed-ratio.log")"
  fi
fi
if has constrainedqwen; then
  make_q8
  QPID=$(serve46 cuda 8462 $Q8)
  if up46 8462 "$QPID"; then
    timeout 400 python3 "$G/constrained_check.py" bench https://127.0.0.1:8462 qwen3-8b-embedding ${CONSTRAINED_QWEN_BATCHES:-64} \
      --rounds "${CONSTRAINED_QWEN_ROUNDS:-3}" --tokens 128 >"$OUT/constrainedqwen-bench.log" 2>&1
    note "constrainedqwen bench (Qwen3-8B-shaped, real Qwen3 tokenizer, CUDA): rc=$?"
    grep -E '^RESULT |Error' "$OUT/constrainedqwen-bench.log" | tee -a "$SUMMARY"
    sed -n 's/^RESULT_JSON //p' "$OUT/constrainedqwen-bench.log" >"$OUT/constrainedqwen-bench.json"
  fi
  kill -TERM "$QPID" 2>/dev/null; wait "$QPID" 2>/dev/null
  # With CONSTRAINED_QWEN_OFFLINE=1: the engine alone (bench offline, no HTTP), both arms at
  # batch 64, 128 tokens each: throughput and the engine thread's host work per step.
  if [ "${CONSTRAINED_QWEN_OFFLINE:-0}" = 1 ]; then
    for arm in free json_schema; do
      args=(--model $Q8 --device cuda --batch-size 64 --input-len 16 --output-len 128 --ignore-eos
        --temperature 1 --json "$OUT/constrainedqwen-offline-$arm.json")
      [ $arm = json_schema ] && args+=(--json-schema "$PWD/scripts/bench-notes-schema.json")
      timeout 240 $RUN "$G/inferno" bench offline "${args[@]}" >"$OUT/constrainedqwen-offline-$arm.log" 2>&1
      note "constrainedqwen offline $arm: rc=$? $(grep -E '^(output throughput|engine steps) ' "$OUT/constrainedqwen-offline-$arm.log" | tr '\n' ' ')"
    done
  fi
fi

# Start-up to first token: plaintext and a sealed copy (development profile, key file), page
# cache warm for both. One discarded plaintext run first fills the NVRTC kernel cache; then the
# two alternate, twice each. Prints seconds from launch to the first completion's last byte;
# each run's log (RUST_LOG=info: the timeline of opening, loading and uploading) is kept.
if has sealedstart; then
  S8=/tmp/llama8b.sealed
  rm -rf $S8 /tmp/llama8b.key
  $RUN "$G/inferno" seal --model $M8 --out $S8 --key-file /tmp/llama8b.key \
    >"$OUT/seal.log" 2>&1
  note "inferno seal (8B-shaped): rc=$? $(head -1 "$OUT/seal.log")"
  cat $M8/* $S8/* >/dev/null
  # Reading a cached shard into a fresh buffer in 4 KiB pages against advised huge pages
  # (src/model/buffer.rs), on every core.
  note "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"
  if gcc -O2 -o /tmp/read-buffer-bench "$G/read-buffer-bench.c" -lpthread 2>"$OUT/read-buffer-bench.log"; then
    largest=$(ls -S $M8/*.safetensors | head -1)
    /tmp/read-buffer-bench "$largest" "$(nproc)" 2>&1 | tee -a "$OUT/read-buffer-bench.log" | tee -a "$SUMMARY"
  else
    note "read-buffer-bench: gcc failed"
  fi
  printf '[attestation]\nprofile = "development"\n' >/tmp/sealed-dev.toml
  first_token() { # LOG MODEL_DIR EXTRA_ARGS... -> seconds to the first completion
    local t0 t1 log=$1
    shift
    t0=$(date +%s.%N)
    RUST_LOG=info $RUN "${FT_BIN:-$G/inferno}" serve --model "$1" --device cuda --listen 127.0.0.1:8445 \
      --config /tmp/sealed-dev.toml "${@:2}" >"$OUT/$log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 1200); do
      curl -ksf https://127.0.0.1:8445/health >/dev/null 2>&1 && break
      sleep 0.05
    done
    curl -ksf https://127.0.0.1:8445/v1/completions -H 'content-type: application/json' \
      -d '{"model":"'"$(basename "$1")"'","prompt":"Hello","max_tokens":1}' >/dev/null
    t1=$(date +%s.%N)
    kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
    python3 -c "print(round($t1 - $t0, 3))"
  }
  warm=$(first_token sealedstart-warmup.log $M8)
  note "start-up to first token, warm-up (kernel cache): plaintext ${warm} s"
  # COLD_BINS names more binaries of .gpu (say "inferno inferno-base") to start in turn, warm
  # here (WARM_RUNS rounds, default 2, binaries alternating) and cold below.
  plain=(); sealed=(); declare -A other=()
  for i in $(seq 1 "${WARM_RUNS:-2}"); do
    plain+=("$(first_token sealedstart-plain-$i.log $M8)")
    sealed+=("$(first_token sealedstart-sealed-$i.log $S8 --model-key-file /tmp/llama8b.key)")
    for b in ${COLD_BINS:-inferno}; do
      [ "$b" = inferno ] && continue
      other[$b]+=" $(FT_BIN="$G/$b" first_token sealedstart-plain-$b-$i.log $M8)"
    done
  done
  best() { python3 -c "import sys; print(min(float(x) for x in sys.argv[1:]))" "$@"; }
  note "start-up to first token: plaintext ${plain[*]} s, sealed ${sealed[*]} s (ratio of the bests $(python3 -c "print(round($(best "${sealed[@]}") / $(best "${plain[@]}"), 3))"))"
  for b in ${COLD_BINS:-inferno}; do
    [ "$b" = inferno ] && continue
    note "start-up to first token, $b: plaintext${other[$b]} s"
  done
  for f in "$OUT"/sealedstart-plain-1.log "$OUT"/sealedstart-sealed-1.log; do
    note "$(basename "$f"):"
    grep -E 'listening|platform passed|sealed model opened|model loaded|backend prepared|CUDA backend ready|weights placed|weights uploaded|KV cache allocated|decode graphs captured|sequence limit|engine ready|ready$' "$f" | cut -c1-260 | tee -a "$SUMMARY"
  done
  # From a cold page cache (issue 13 target 2: within 1 s of the disk's sequential read time):
  # the model's files read in order by one reader, then the start-ups, each after dropping caches.
  # The disk's rate drifts by several percent within a call, so every round first times its own
  # sequential read and its start-ups are compared with that.
  if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    bytes=$(stat -c %s $M8/* | awk '{s += $1} END {print s}')
    # COLD_ROUNDS (default 1) repeats the cold start-ups, binaries alternating.
    for r in $(seq 1 "${COLD_ROUNDS:-1}"); do
      sync && echo 3 >/proc/sys/vm/drop_caches
      t0=$(date +%s.%N)
      cat $M8/* >/dev/null
      t1=$(date +%s.%N)
      seq_read=$(python3 -c "print(round($t1 - $t0, 3))")
      note "cold page cache, round $r: sequential read of the model ${seq_read} s ($(python3 -c "print(round($bytes / ($t1 - $t0) / 1e9, 2))") GB/s)"
      for b in ${COLD_BINS:-inferno}; do
        sync && echo 3 >/proc/sys/vm/drop_caches
        log=sealedstart-cold
        [ "$b" = inferno ] || log=$log-$b
        [ "$r" = 1 ] || log=$log-r$r
        cold=$(FT_BIN="$G/$b" first_token $log.log $M8)
        note "cold page cache, $b, round $r: start-up to first token ${cold} s ($(python3 -c "print(round($cold - $seq_read, 3))") s over the round's sequential read)"
        grep -E 'platform passed|backend prepared|CUDA backend ready|weights placed|weights uploaded' "$OUT/$log.log" | cut -c1-400 | tee -a "$SUMMARY"
      done
    done
  else
    note "cold page cache: not measured (cannot drop the page cache here)"
  fi
  # The one-line start-up timeline (src/cli/startup.rs) of every timed run, phases in ms.
  for f in "$OUT"/sealedstart-plain-*.log "$OUT"/sealedstart-sealed-*.log "$OUT"/sealedstart-cold*.log; do
    note "$(basename "$f" .log) timeline: $(sed 's/\x1b\[[0-9;]*m//g' "$f" | grep -o 'start-up timeline.*' | tail -1)"
  done
fi

# What a cold start-up pays for the CUDA libraries (issue 13 target 2): .gpu/libload-probe.py's
# dlopen, driver initialisation, context and cuBLASLt handle, each mode after dropping the page
# cache: alone; after the libraries were read whole (cat); beside eight parallel readers of the
# model (as the server reads it); beside one sequential reader; beside eight readers after the
# libraries were read whole. Needs the 8B-shaped model of the sealedstart stage.
if has libload && [ -d "$M8" ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
  lib_files=()
  for name in libcuda.so.1 libnvrtc.so.13 libcublasLt.so.13; do
    for dir in ${LD_LIBRARY_PATH//:/ } /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
      [ -e "$dir/$name" ] && { lib_files+=("$(readlink -f "$dir/$name")"); break; }
    done
  done
  note "libload: $(for f in "${lib_files[@]}"; do printf '%s %s MB; ' "$(basename "$f")" $(($(stat -c %s "$f") / 1000000)); done)"
  seconds_since() { python3 -c "import time; print(round(time.time() - $1, 3))"; }
  for mode in alone libs-read-first beside-8-readers beside-1-reader libs-read-beside-8-readers; do
    sync && echo 3 >/proc/sys/vm/drop_caches
    readers=()
    t0=$(date +%s.%N)
    case $mode in
      beside-8-readers | libs-read-beside-8-readers)
        for f in "$M8"/*.safetensors; do cat "$f" >/dev/null & readers+=($!); done ;;
      beside-1-reader) cat "$M8"/* >/dev/null & readers+=($!) ;;
    esac
    if [[ $mode == libs-read* ]]; then
      t1=$(date +%s.%N)
      cat "${lib_files[@]}" >/dev/null
      note "libload $mode: libraries read whole in $(seconds_since "$t1") s"
    fi
    $RUN python3 "$G/libload-probe.py" "$mode" 2>&1 | tee -a "$SUMMARY"
    if [ ${#readers[@]} -gt 0 ]; then
      wait "${readers[@]}"
      note "libload $mode: the model's readers finished $(seconds_since "$t0") s after they started"
    fi
  done
fi

# Issue 51 (spec): per-position logits and speculative decoding on CUDA. .gpu/cuda_speculative on
# the fixtures (step_logits against the CPU backend at every position of an echoed prompt and a
# verification row; device-sampled verified positions against the argmax; greedy identity with
# and without speculation through the engine), then on the 8B-shaped weights: greedy identity
# (SPEC_PROMPTS prompts), the verification step's cost at K=4 against a decode step at batch 1 and
# 8 (mixed graphs on and off) and ncu's time per kernel of both steps (SPEC_PROFILE), bench offline
# plain against forced acceptance (SPEC_FORCED, shares; forced 0 twice) at batch 1 and 8 with the
# predicted speed-up, and concurrency 64 with the adaptive rule on against no speculation
# (target: at most 2% lower).
if has spec; then
  S=$OUT/spec
  mkdir -p "$S"
  timeout 300 $RUN "$G/cuda_speculative" --include-ignored --test-threads=1 --nocapture >"$S/fixtures.log" 2>&1
  note "spec (tests/cuda_speculative.rs, fixtures): rc=$? $(grep -E '^test result' "$S/fixtures.log")"
  grep -E '^RESULT|panicked|^prompt ' "$S/fixtures.log" | head -20 | tee -a "$SUMMARY"
  if [ "${SPEC_SANITIZE:-1}" = 1 ]; then
    timeout 240 $RUN compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 "$G/cuda_speculative" \
      --include-ignored --test-threads=1 step_logits_match >"$S/sanitizer.log" 2>&1
    note "compute-sanitizer memcheck (cuda_speculative step_logits_match): rc=$? $(grep -E 'ERROR SUMMARY' "$S/sanitizer.log" | tail -1)"
  fi
  [ -d $M8 ] || PYTHONUNBUFFERED=1 python3 "$G/make_llama8b.py" $M8 >"$OUT/make8b.log" 2>&1
  for t in greedy_output_is_identical_with_speculation_on_cuda verification_step_cost_against_a_decode_step; do
    INFERNO_SPEC_MODEL=$M8 INFERNO_SPEC_PROMPTS=${SPEC_PROMPTS:-8} timeout 180 $RUN "$G/cuda_speculative" --include-ignored \
      --test-threads=1 --nocapture --exact "$t" >"$S/8b-$t.log" 2>&1
    note "spec 8B $t: rc=$? $(grep -E '^test result' "$S/8b-$t.log")"
    grep -E '^RESULT|panicked|^prompt ' "$S/8b-$t.log" | head -20 | tee -a "$SUMMARY"
  done
  # SPEC_PROFILE=B (default 8; 0: off): ncu's time of each kernel of one decode step and of one
  # verification step (K = 4) at batch B on the 8B-shaped weights, summed per kernel name (the
  # step before the first sample_tokens is the decode step): where the verification step's extra
  # time goes (products at M = 5B through cuBLASLt against the small-M kernels, attention over 5
  # query positions a sequence, the LM head and sampling at 5B positions).
  if [ "${SPEC_PROFILE:-8}" != 0 ] && command -v ncu >/dev/null; then
    INFERNO_SPEC_MODEL=$M8 INFERNO_SPEC_PROFILE=${SPEC_PROFILE:-8} timeout 150 ncu --profile-from-start off \
      --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
      "$G/cuda_speculative" --include-ignored --test-threads=1 --nocapture --exact \
      verification_step_cost_against_a_decode_step >"$S/ncu-steps.csv" 2>&1
    note "spec ncu of a decode and a verification step, batch ${SPEC_PROFILE:-8}: rc=$?"
    python3 - "$S/ncu-steps.csv" <<'PY' | tee -a "$SUMMARY"
import csv, re, sys
from collections import defaultdict
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
rows = [r for r in csv.DictReader(lines) if r.get("ID", "").isdigit()]
kernel = lambda r: r.get("Kernel Name") or r.get("Function Name") or "?"
if not rows:
    print("spec ncu: no kernels profiled"); sys.exit()
steps, current = [], []
for r in rows:
    current.append(r)
    if "sample_tokens" in kernel(r) and not steps:
        steps.append(current); current = []
steps.append(current)
if len(steps) != 2:
    print("spec ncu: no sample_tokens launch to split the steps at"); sys.exit()
def name(k):  # cuBLASLt's kernels under one name, the rest without template arguments
    return "cublasLt " + k[:40] if re.search(r"gemm|xmma|cutlass|sm90", k) else re.sub(r"[<(].*", "", k)
sums = []
for step in steps:
    t = defaultdict(float)
    for r in step:
        t[name(kernel(r))] += float(r["gpu__time_duration.sum"].replace(",", ""))
    sums.append(t)
total = [sum(t.values()) for t in sums]
print(f"spec ncu: decode step {total[0] / 1e3:.1f} us in {len(steps[0])} kernels, verification step "
      f"{total[1] / 1e3:.1f} us in {len(steps[1])} kernels (ratio {total[1] / max(total[0], 1):.3f})")
for k in sorted(set(sums[0]) | set(sums[1]), key=lambda k: -(sums[1].get(k, 0) + sums[0].get(k, 0))):
    print(f"    {k[:60]:60s} decode {sums[0].get(k, 0) / 1e3:9.1f} us  verification {sums[1].get(k, 0) / 1e3:9.1f} us")
PY
  fi
  spec_bench() { # NAME LOAD... : bench offline on the 8B-shaped weights, in 256, out 128
    local name=$1
    shift
    timeout 180 $RUN "$G/inferno" bench offline --model $M8 --device cuda --input-len 256 --output-len 128 \
      --ignore-eos "$@" --json "$S/bench-$name.json" >"$S/bench-$name.log" 2>&1
    note "spec bench $name ($*): rc=$? $(grep -E '^output throughput' "$S/bench-$name.log" | tail -1)"
    grep -E '^(ITL|engine steps|speculation) ' "$S/bench-$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    # The start-up's cuBLASLt candidate timing (shapes, time, heuristic's first against chosen).
    grep -m1 'cuBLASLt candidates timed' "$S/bench-$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
  }
  for b in ${SPEC_BATCHES:-1 8}; do
    spec_bench "b$b-plain" --batch-size $b
    spec_bench "b$b-forced0" --batch-size $b --speculative ngram --forced-acceptance 0
    for share in ${SPEC_FORCED:-0.7}; do
      spec_bench "b$b-forced$share" --batch-size $b --speculative ngram --forced-acceptance $share
    done
    # Forced 0 once more, after the accepting runs: how much a run's TPOT varies.
    spec_bench "b$b-forced0-again" --batch-size $b --speculative ngram --forced-acceptance 0
  done
  spec_bench c64-plain --concurrency 64 --num-prompts ${SPEC_C64_PROMPTS:-192}
  spec_bench c64-adaptive --concurrency 64 --num-prompts ${SPEC_C64_PROMPTS:-192} --speculative ngram
  # The prediction: a step verifying K=4 proposals each accepted with probability s yields
  # (1 - s^5) / (1 - s) tokens; it costs (forced-0 ITL / plain ITL) decode steps. "steps only"
  # is that ratio of throughputs (prefill left in the cost); "with prefill" adds the terms it omits
  # (docs/engine.md, "Forced acceptance"): the prefill (TTFT) that speculation does not shorten,
  # and the last steps, whose proposals max_tokens cuts short (expected time of the decode part
  # over the truncated geometric acceptance, verification steps at the forced-0 TPOT and plain
  # steps at the plain TPOT). "decode part" compares TPOTs alone.
  python3 - "$S" ${SPEC_BATCHES:-1 8} <<'PY' | tee -a "$SUMMARY"
import glob, json, os, sys
from functools import lru_cache
d = sys.argv[1]
def run(name):
    p = f"{d}/bench-{name}.json"
    return json.load(open(p)) if os.path.exists(p) else None
def tput(name):
    r = run(name)
    return r["output_token_throughput"] if r else None
for b in sys.argv[2:]:
    plain, zero = run(f"b{b}-plain"), run(f"b{b}-forced0")
    if not plain or not zero:
        print(f"spec prediction batch {b}: missing runs"); continue
    cost = plain["output_token_throughput"] / zero["output_token_throughput"]
    tpot_plain, tpot_zero = plain["tpot_ms"]["mean"], zero["tpot_ms"]["mean"]
    length, k = plain["output_len"], 4
    for p in sorted(glob.glob(f"{d}/bench-b{b}-forced0.*.json")):
        s = float(p.rsplit("forced", 1)[1][:-5])
        forced = json.load(open(p))
        tokens = (1 - s**(k + 1)) / (1 - s)
        @lru_cache(None)
        def decode_ms(left):  # expected time to produce `left` more tokens
            if left <= 0:
                return 0.0
            room = min(k, left - 1)
            if room == 0:
                return tpot_plain + decode_ms(left - 1)
            after = sum(s**a * (1 - s) * decode_ms(left - 1 - a) for a in range(room))
            return tpot_zero + after + s**room * decode_ms(left - 1 - room)
        with_prefill = plain["e2e_ms"]["mean"] / (plain["ttft_ms"]["mean"] + decode_ms(length - 1))
        measured = forced["output_token_throughput"] / plain["output_token_throughput"]
        print(f"spec prediction batch {b}: verification cost {cost:.3f} decode steps (forced 0; "
              f"TPOT {tpot_zero / tpot_plain:.3f}), s={s}: {tokens:.2f} tokens/step, predicted speed-up "
              f"{tokens / cost:.3f} (steps only), {with_prefill:.3f} (with prefill and the last steps), "
              f"measured {measured:.3f}; decode part {tokens * tpot_plain / tpot_zero:.3f} predicted, "
              f"{tpot_plain / forced['tpot_ms']['mean']:.3f} measured")
    again = run(f"b{b}-forced0-again")
    if again:
        print(f"spec prediction batch {b}: forced 0 TPOT {tpot_zero:.3f} ms, again after the accepting runs "
              f"{again['tpot_ms']['mean']:.3f} ms")
plain, adaptive = tput("c64-plain"), tput("c64-adaptive")
if plain and adaptive:
    print(f"spec concurrency 64: adaptive speculation {adaptive:.1f} tok/s against {plain:.1f} without "
          f"({100 * (adaptive / plain - 1):+.2f}%, target >= -2%)")
PY
fi

# The audit log's cost at saturation (tests/audit_bench.rs, CPU backend, embedded model) on this
# machine's otherwise idle cores: side by side, then the A/A calibration (both servers unaudited).
if has auditbench && [ -x "$G/audit_bench" ]; then
  want=$(cat "$G/INFERNO_BIN_PATH")
  mkdir -p "$(dirname "$want")" && cp "$G/inferno" "$want"
  for mode in audited calibrate; do
    calibrate=0; [ $mode = calibrate ] && calibrate=1
    AUDIT_BENCH_CALIBRATE=$calibrate AUDIT_BENCH_PAIRS=${AUDIT_BENCH_PAIRS:-16} timeout 300 \
      $RUN "$G/audit_bench" --ignored --nocapture --test-threads 1 serving_throughput >"$OUT/audit-bench-$mode.log" 2>&1
    note "audit bench ($mode): rc=$?"
    grep -E 'pairs of|cost per pair' "$OUT/audit-bench-$mode.log" | tee -a "$SUMMARY"
  done
fi

# fp8kv (issue 43, item 6): the FP8 KV cache. The decode and prefill attention harnesses built
# with -DKV_FP8=1 (the quantized write and the widening against the host's E4M3 rounding, then the
# kernels on E4M3 keys and values at per-layer scales against the float64 reference), memcheck,
# the decode attention's bench at batch 256 and 4k context for both caches (target: FP8 <= 0.8x
# bf16), tests/cuda_kv_fp8.rs (CUDA against the CPU backend with the same cache, sizing, prefix
# hits), and bench offline on the 8B-shaped weights with --kv-cache-dtype fp8 against the bf16
# cache at FP8KV_SPEC ("batch input output", default 64 3968 64: the KV read is twice the
# weights' there). FP8KV_SKIP_OFFLINE=1 leaves the offline benches out.
if has fp8kv; then
  K=$OUT/fp8kv
  mkdir -p "$K"
  kv_build() { # NAME HARNESS FP8 Q KV HEAD_DIM WINDOW [DEFINES]
    nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I"$G/kernels" -DNUM_Q_HEADS=$4 -DNUM_KV_HEADS=$5 \
      -DHEAD_DIM=$6 -DSLIDING_WINDOW=$7 -DKV_BLOCK=16 -DKV_FP8=$3 $ATTN_GEOMETRY -DATTN_MERGE_SPLITS=8 ${8:--DATTN_DEPTH_FP8=2} -Xptxas -v \
      "$G/$2" -lcublas -o "$K/$1" >"$K/$1.build.log" 2>&1 || note "fp8kv BUILD FAILED $1: $(grep -m2 error "$K/$1.build.log")"
  }
  KV_ATTN_CONFIGS="32 8 128 0;16 2 64 100;4 2 96 0;4 2 32 0;4 2 16 0;6 2 16 0"
  KV_PREFILL_CONFIGS="32 8 128 0;16 2 64 100;6 2 16 0;4 2 32 0"
  MMA_GEOMETRY="-DF_WGMMA=0 -DF_ROWS=64 -DF_KEYS=32 -DF_SHARED=0"
  IFS=';' read -ra KV_ATTN <<<"$KV_ATTN_CONFIGS"
  IFS=';' read -ra KV_PREFILL <<<"$KV_PREFILL_CONFIGS"
  for cfg in "${KV_ATTN[@]}"; do set -- $cfg; kv_build "attn-fp8-$1-$2-$3-$4" attention-check.cu 1 "$@" & done
  for cfg in "${KV_PREFILL[@]}"; do set -- $cfg; kv_build "prefill-fp8-$1-$2-$3-$4" prefill-check.cu 1 "$@" "$MMA_GEOMETRY" & done
  kv_build attn-bf16-32-8-128-0 attention-check.cu 0 32 8 128 0 &
  # FP8KV_VARIANTS="NAME:DEFINES;...": the 8B heads' FP8 decode attention built with other
  # defines (say "-DATTN_DEPTH_FP8=3"), tested and benched beside.
  IFS=";" read -ra KV_VARIANTS <<<"${FP8KV_VARIANTS:-d3:-DATTN_DEPTH_FP8=3;d4:-DATTN_DEPTH_FP8=4}"
  for named in "${KV_VARIANTS[@]}"; do kv_build "attn-fp8${named%%:*}-32-8-128-0" attention-check.cu 1 32 8 128 0 "${named#*:}" & done
  wait
  for log in "$K"/attn-*32-8-128-0.build.log "$K"/prefill-fp8-32-8-128-0.build.log; do
    grep -h -A2 -E "for (paged_attention|prefill_attention)" "$log" 2>/dev/null | grep -E "Used|spill" | sed "s|^|$(basename "$log" .build.log) |" | tee -a "$SUMMARY"
  done
  fails=0
  for name in $(for c in "${KV_ATTN[@]}"; do set -- $c; echo "attn-fp8-$1-$2-$3-$4"; done) $(for c in "${KV_PREFILL[@]}"; do set -- $c; echo "prefill-fp8-$1-$2-$3-$4"; done) $(for v in "${KV_VARIANTS[@]}"; do echo "attn-fp8${v%%:*}-32-8-128-0"; done); do
    [ -x "$K/$name" ] || { fails=$((fails + 1)); continue; }
    timeout 60 "$K/$name" test >"$K/test-$name.log" 2>&1 || fails=$((fails + 1))
    grep -h '^RESULT' "$K/test-$name.log" >>"$SUMMARY" || note "fp8kv test $name: no result"
    grep -h '^MISMATCH' "$K/test-$name.log" | head -3 >>"$SUMMARY"
  done
  note "fp8kv kernel tests: $fails failed"
  for name in attn-fp8-32-8-128-0 attn-fp8-4-2-16-0 prefill-fp8-6-2-16-0; do
    [ -x "$K/$name" ] || continue
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$K/$name" test >"$K/sanitizer-$name.log" 2>&1
    note "fp8kv compute-sanitizer memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY' "$K/sanitizer-$name.log" | tail -1)"
  done
  # Decode attention alone, 8B heads, batch 256 at 4k context (and batch 64 at 4k, 256 at 1k).
  for ctx_batch in "256 4096" "64 4096" "256 1024"; do
    set -- $ctx_batch
    for cache in bf16 fp8 $(for v in "${KV_VARIANTS[@]}"; do echo "fp8${v%%:*}"; done); do
      [ -x "$K/attn-$cache-32-8-128-0" ] || continue
      timeout 60 "$K/attn-$cache-32-8-128-0" bench 0 "$1" "$2" >"$K/bench-$cache-$1-$2.log" 2>&1
      grep -h '^RESULT attention bench' "$K/bench-$cache-$1-$2.log" | sed "s/^/$cache /" | tee -a "$SUMMARY"
    done
    python3 - "$K/bench-bf16-$1-$2.log" "$K/bench-fp8-$1-$2.log" <<'PY' | tee -a "$SUMMARY"
import re, sys
def graph_us(path):
    m = re.search(r"graph ([0-9.]+) us", open(path).read())
    return float(m.group(1)) if m else None
b, f = graph_us(sys.argv[1]), graph_us(sys.argv[2])
if b and f:
    print(f"fp8kv decode attention (graph): fp8 {f:.1f} us / bf16 {b:.1f} us = {f / b:.3f}x (target <= 0.8)")
else:
    print("fp8kv decode attention: no figures")
PY
  done
  $RUN "$G/cuda_kv_fp8" --include-ignored --test-threads=1 --nocapture >"$K/cuda_kv_fp8.log" 2>&1
  note "fp8kv correctness (tests/cuda_kv_fp8.rs): rc=$? $(grep -E '^test result' "$K/cuda_kv_fp8.log")"
  grep -E '^RESULT|panicked' "$K/cuda_kv_fp8.log" | head -20 | tee -a "$SUMMARY"
  if [ -z "${FP8KV_SKIP_OFFLINE:-}" ]; then
    [ -d $M8 ] || PYTHONUNBUFFERED=1 python3 "$G/make_llama8b.py" $M8 >"$K/make8b.log" 2>&1
    set -- ${FP8KV_SPEC:-64 3968 64}
    for cache in auto fp8; do
      log="$K/offline-$cache-b$1-i$2-o$3.log"
      timeout ${FP8KV_BENCH_TIMEOUT:-200} $RUN "$G/inferno" bench offline --model $M8 --device cuda --batch-size "$1" \
        --input-len "$2" --output-len "$3" --ignore-eos --kv-cache-dtype $cache --json "${log%.log}.json" >"$log" 2>&1
      note "fp8kv offline kv-cache-dtype=$cache batch=$1 in=$2 out=$3: rc=$? $(grep -E '^output throughput' "$log" | tail -1)"
      grep -E '^(TTFT|ITL|engine steps) |KV cache allocated' "$log" | head -4 | sed 's/^/    /' | tee -a "$SUMMARY"
    done
  fi
fi

if has peers; then
  PYTHONUNBUFFERED=1 timeout 330 python3 "$G/peers.py" $M8 "$OUT/peers.json" --batches 1,16 >"$OUT/peers.log" 2>&1
  note "peers: rc=$?"
  grep -E '^\{|^eager|^static' "$OUT/peers.log" | tee -a "$SUMMARY"
fi

# Mixture of experts (issue 44). The kernels alone (.gpu/moe-check.cu, nvcc, once per expert
# shape: Qwen3-30B-A3B's top-8 of 128, and a tiny top-2 of 8 with a shared expert): routing with
# boundary ties against libstdc++'s selection (torch.topk's CPU order), the permutation, the grouped
# products, the combine and the one-token down + combine against host references, compute-sanitizer
# memcheck; then tests/cuda_moe.rs (.gpu/cuda_moe: the three tiny MoE fixtures against the CPU
# backend, with near-tie routing reported, and transformers, and memcheck over its prefill test).
# MOE_SKIP_CHECKS=1 leaves all of that out. MOE_BENCH=1: the routed part of a Qwen3-30B-A3B layer
# timed alone at 1 to 2048 tokens (and the expert products alone, for their share of a step), then
# Qwen3-30B-A3B-shaped random weights (scripts/make_moe_shaped.py, MOE_LAYERS layers, default 12
# of the real 48 to fit the disk) and MOE_SPECS offline ("BATCH IN OUT [flags]", a batch cN a closed
# loop of N: default batch 1 and 64 at 1000/256), batch 1's inter-token latency set against the
# active-weight floor at 3.0 TB/s and a cN run's against the expert products' time at 256 tokens
# times the layers; MOE_DENSE=1 runs the same specs (or MOE_DENSE_SPECS) on the 8B-shaped dense
# model beside.
if has moe; then
  MO=$OUT/moe
  mkdir -p "$MO"
  MOE_GEMV="-DGEMV_ROWS=4 -DGEMV_WARPS=4 -DGEMV_MMA_FROM=1 -DGEMV_MMA_WARPS=8 -DGEMV_MMA_STAGES=5"
  MOE_HEADS="-DNUM_Q_HEADS=4 -DNUM_KV_HEADS=2 -DHEAD_DIM=16 -DQKV_BIAS=0"
  moe_build() { # NAME DEFINES
    timeout 300 nvcc -O3 -arch=sm_90a -std=c++17 -I"$G/kernels" -I"$G" $MOE_GEMV $MOE_HEADS $2 -Xptxas -v "$G/moe-check.cu" \
      -o "$MO/$1" >"$MO/$1.build.log" 2>&1 || note "moe-check $1 BUILD FAILED: $(grep -m3 error "$MO/$1.build.log")"
  }
  if [ -z "${MOE_SKIP_CHECKS:-}" ] || [ -n "${MOE_BENCH:-}" ]; then
    moe_build a3b "-DHIDDEN=2048 -DINTERMEDIATE=768 -DMOE_EXPERTS=128 -DMOE_TOP_K=8 -DMOE_RENORMALIZE=1 -DMOE_LOGITS=128 -DMOE_INTER=768 -DMOE_SHARED_INTER=0" &
  fi
  if [ -z "${MOE_SKIP_CHECKS:-}" ]; then
    moe_build tiny "-DHIDDEN=64 -DINTERMEDIATE=32 -DMOE_EXPERTS=8 -DMOE_TOP_K=2 -DMOE_RENORMALIZE=0 -DMOE_LOGITS=9 -DMOE_INTER=32 -DMOE_SHARED_INTER=48" &
  fi
  wait
  if [ -z "${MOE_SKIP_CHECKS:-}" ]; then
    for shape in a3b tiny; do
      [ -x "$MO/$shape" ] || continue
      timeout 120 "$MO/$shape" test >"$MO/$shape-test.log" 2>&1
      note "moe-check $shape: rc=$? $(grep -c ': ok$' "$MO/$shape-test.log") ok, $(grep -c 'FAIL$' "$MO/$shape-test.log") failed"
      grep -h '^RESULT' "$MO/$shape-test.log" | sed 's/^/    /' >>"$SUMMARY"
      grep -v '^RESULT' "$MO/$shape-test.log" | head -5 | sed 's/^/    /' | tee -a "$SUMMARY"
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$MO/$shape" quick >"$MO/$shape-sanitizer.log" 2>&1
      note "compute-sanitizer memcheck moe-check $shape: rc=$? $(grep -E 'ERROR SUMMARY' "$MO/$shape-sanitizer.log" | tail -1)"
    done
    if [ -x "$G/cuda_moe" ]; then
      timeout 300 $RUN "$G/cuda_moe" --include-ignored --test-threads=1 --nocapture >"$OUT/moe-correctness.log" 2>&1
      note "moe correctness (tests/cuda_moe.rs): rc=$? $(grep -E '^test result' "$OUT/moe-correctness.log")"
      grep -E 'RESULT|panicked|differ' "$OUT/moe-correctness.log" | head -30 | tee -a "$SUMMARY"
      timeout 300 $RUN compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
        "$G/cuda_moe" --include-ignored --test-threads=1 prefill_logits >"$OUT/moe-sanitizer.log" 2>&1
      note "compute-sanitizer memcheck (tests/cuda_moe.rs prefill_logits): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/moe-sanitizer.log" | tail -1)"
    fi
  fi
  if [ -n "${MOE_BENCH:-}" ]; then
    if [ -x "$MO/a3b" ]; then
      timeout 90 "$MO/a3b" bench >"$MO/bench.log" 2>&1
      note "moe-check a3b bench: rc=$?"
      grep -h '^RESULT' "$MO/bench.log" | tee -a "$SUMMARY"
    fi
    # The expert products alone at 256 tokens, in us per layer (for a cN run's share).
    experts_256=$(grep -o 'tokens=256 .*expert products alone [0-9.]* us' "$MO/bench.log" 2>/dev/null | grep -o '[0-9.]* us$' | grep -o '^[0-9.]*')
    MM=${MOE_MODEL_DIR:-/tmp/qwen3-moe-shaped}
    df -h /tmp /dev/shm | sed 's/^/    /' >>"$SUMMARY"
    PYTHONUNBUFFERED=1 timeout 600 python3 "$G/make_moe_shaped.py" $MM "${MOE_LAYERS:-12}" >"$MO/make.log" 2>&1
    note "MoE-shaped weights: $(tail -1 "$MO/make.log")"
    active=$(grep -o 'active bytes per decode token: [0-9]*' "$MO/make.log" | grep -o '[0-9]*$')
    [ -n "$active" ] && note "active-weight floor: $(python3 -c "print(f'{$active/1e9:.3f} GB per token: {$active/3.0e12*1e3:.3f} ms at 3.0 TB/s')")"
    IFS=';' read -ra MOE_SPEC_LIST <<<"${MOE_SPECS:-1 1000 256;64 1000 256}"
    for spec in "${MOE_SPEC_LIST[@]}"; do
      set -- $spec
      b=$1 i=$2 o=$3
      shift 3
      load=(--batch-size "$b")
      [[ $b == c* ]] && load=(--concurrency "${b#c}")
      log=$MO/bench-b$b-i$i-o$o.log
      timeout ${MOE_BENCH_TIMEOUT:-300} $RUN "$G/inferno" bench offline --model $MM --device cuda "${load[@]}" --input-len "$i" \
        --output-len "$o" --ignore-eos "$@" --json "$MO/bench-b$b-i$i-o$o.json" >"$log" 2>&1
      note "moe offline batch=$b in=$i out=$o $*: rc=$? $(grep -E '^output throughput' "$log" | tail -1)"
      grep -E '^(TTFT|ITL|engine steps) ' "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
      grep -E 'weights uploaded|KV cache allocated|panicked|Error|error' "$log" | head -3 | sed 's/^/    /' >>"$SUMMARY"
      itl=$(grep -E '^ITL ' "$log" | awk '{print $3}')
      if [ -n "$itl" ] && [ "$b" = 1 ] && [ -n "$active" ]; then
        note "moe batch 1: ITL p50 $itl ms against the active-weight floor $(python3 -c "print(f'{$active/3.0e12*1e3:.3f} ms: {$active/3.0e12*1e3/$itl*100:.1f}% of the floor (target 75%)')")"
      fi
      if [ -n "$itl" ] && [[ $b == c* ]] && [ -n "$experts_256" ]; then
        note "moe $b: ITL p50 $itl ms; expert products at 256 tokens $experts_256 us x ${MOE_LAYERS:-12} layers = $(python3 -c "e=$experts_256*${MOE_LAYERS:-12}/1e3; print(f'{e:.3f} ms: {e/$itl*100:.1f}% of a decode step')")"
      fi
    done
    # MOE_DENSE=1: the same specs (MOE_DENSE_SPECS if set) on the Llama-3.1-8B-shaped dense model
    # (16 GB of weights, about the 12-layer MoE's total), for the batch-64 comparison at equal total
    # bytes.
    if [ -n "${MOE_DENSE:-}" ]; then
      [ -d $M8 ] || PYTHONUNBUFFERED=1 timeout 600 python3 "$G/make_llama8b.py" $M8 >"$OUT/make8b.log" 2>&1
      note "MoE total weights: $(du -sh $MM | cut -f1), dense comparison: $(du -sh $M8 | cut -f1)"
      IFS=';' read -ra MOE_DENSE_LIST <<<"${MOE_DENSE_SPECS:-${MOE_SPECS:-1 1000 256;64 1000 256}}"
      for spec in "${MOE_DENSE_LIST[@]}"; do
        set -- $spec
        b=$1 i=$2 o=$3
        shift 3
        load=(--batch-size "$b")
        [[ $b == c* ]] && load=(--concurrency "${b#c}")
        log=$MO/dense-b$b-i$i-o$o.log
        timeout ${MOE_BENCH_TIMEOUT:-300} $RUN "$G/inferno" bench offline --model $M8 --device cuda "${load[@]}" \
          --input-len "$i" --output-len "$o" --ignore-eos "$@" >"$log" 2>&1
        note "dense (8B-shaped) offline batch=$b in=$i out=$o $*: rc=$? $(grep -E '^output throughput' "$log" | tail -1)"
      done
    fi
  fi
fi

# FP8 experts (issue 44: kernels/moe_fp8.cu, which had not run on a GPU before this stage). The
# kernels alone (.gpu/moe-fp8-check.cu, nvcc, the tiny Mixtral fixture's shape, a 16-expert top-4
# one and Mixtral-8x7B's for the bench): the roundings of the experts' inputs byte for byte, the
# small-M and tile FP8 products and the combine against float64 references for four FP8 schemes,
# memcheck on the tiny build; then tests/cuda_moe.rs's fp8_experts_match_the_cpu_backend (the
# published FP8 MoE fixtures and two quantized at load against the CPU backend). MOE_FP8_BENCH=1:
# the Mixtral-shaped routed layer alone at 1 to 256 tokens, then Mixtral-8x7B-shaped random
# weights (make_moe_shaped.py --shape mixtral, MOE_FP8_LAYERS layers, default 4 of 32 for the disk
# and the time) served with --quantization fp8 (MOE_FP8_SPECS, default batch 1 at 512/128): batch
# 1's inter-token latency against the FP8 active-weight floor at 3.0 TB/s (target 75%).
if has moefp8; then
  MF=$OUT/moefp8
  mkdir -p "$MF"
  MF_FLAGS="-DGEMV_ROWS=4 -DGEMV_WARPS=4 -DGEMV_MMA_FROM=1 -DGEMV_MMA_WARPS=8 -DGEMV_MMA_STAGES=5 -DNUM_Q_HEADS=4 -DNUM_KV_HEADS=2 -DHEAD_DIM=16 -DQKV_BIAS=0"
  moefp8_build() { # NAME DEFINES
    timeout 300 nvcc -O3 -arch=sm_90a -std=c++17 -I"$G/kernels" -I"$G" $MF_FLAGS $2 "$G/moe-fp8-check.cu" \
      -o "$MF/$1" >"$MF/$1.build.log" 2>&1 || note "moe-fp8-check $1 BUILD FAILED: $(grep -m3 error "$MF/$1.build.log")"
  }
  moefp8_build tiny "-DHIDDEN=64 -DINTERMEDIATE=48 -DMOE_EXPERTS=8 -DMOE_TOP_K=2 -DMOE_RENORMALIZE=1 -DMOE_LOGITS=8 -DMOE_INTER=48 -DMOE_SHARED_INTER=0" &
  moefp8_build mid "-DHIDDEN=512 -DINTERMEDIATE=256 -DMOE_EXPERTS=16 -DMOE_TOP_K=4 -DMOE_RENORMALIZE=0 -DMOE_LOGITS=16 -DMOE_INTER=256 -DMOE_SHARED_INTER=0" &
  [ -n "${MOE_FP8_BENCH:-}" ] && moefp8_build mixtral "-DHIDDEN=4096 -DINTERMEDIATE=14336 -DMOE_EXPERTS=8 -DMOE_TOP_K=2 -DMOE_RENORMALIZE=1 -DMOE_LOGITS=8 -DMOE_INTER=14336 -DMOE_SHARED_INTER=0" &
  wait
  for shape in tiny mid; do
    [ -x "$MF/$shape" ] || continue
    timeout 120 "$MF/$shape" test >"$MF/$shape-test.log" 2>&1
    note "moe-fp8-check $shape: rc=$? $(grep -c ': ok$' "$MF/$shape-test.log") ok, $(grep -c 'FAIL$' "$MF/$shape-test.log") failed"
    grep -v '^RESULT' "$MF/$shape-test.log" | head -5 | sed 's/^/    /' | tee -a "$SUMMARY"
  done
  if [ -x "$MF/tiny" ]; then
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$MF/tiny" quick >"$MF/tiny-sanitizer.log" 2>&1
    note "compute-sanitizer memcheck moe-fp8-check tiny: rc=$? $(grep -E 'ERROR SUMMARY' "$MF/tiny-sanitizer.log" | tail -1)"
  fi
  if [ -x "$G/cuda_moe" ]; then
    timeout 240 $RUN "$G/cuda_moe" --include-ignored --test-threads=1 --nocapture fp8_experts >"$MF/correctness.log" 2>&1
    note "moe fp8 correctness (tests/cuda_moe.rs fp8_experts): rc=$? $(grep -E '^test result' "$MF/correctness.log")"
    grep -E 'RESULT|panicked' "$MF/correctness.log" | head -12 | tee -a "$SUMMARY"
  fi
  if [ -n "${MOE_FP8_BENCH:-}" ]; then
    if [ -x "$MF/mixtral" ]; then
      timeout 120 "$MF/mixtral" bench >"$MF/bench.log" 2>&1
      note "moe-fp8-check mixtral bench: rc=$?"
      grep -h '^RESULT' "$MF/bench.log" | tee -a "$SUMMARY"
    fi
    MX=${MOE_FP8_MODEL_DIR:-/tmp/mixtral-shaped}
    PYTHONUNBUFFERED=1 timeout 600 python3 "$G/make_moe_shaped.py" $MX "${MOE_FP8_LAYERS:-4}" --shape mixtral --fp8 >"$MF/make.log" 2>&1
    note "Mixtral-shaped weights: $(tail -1 "$MF/make.log")"
    active=$(grep -o 'active bytes per decode token (FP8): [0-9]*' "$MF/make.log" | grep -o '[0-9]*$')
    [ -n "$active" ] && note "FP8 active-weight floor: $(python3 -c "print(f'{$active/1e9:.3f} GB per token: {$active/3.0e12*1e3:.3f} ms at 3.0 TB/s')")"
    IFS=';' read -ra MF_SPEC_LIST <<<"${MOE_FP8_SPECS:-1 512 128}"
    for spec in "${MF_SPEC_LIST[@]}"; do
      set -- $spec
      b=$1 i=$2 o=$3
      shift 3
      log=$MF/bench-b$b-i$i-o$o.log
      timeout ${MOE_BENCH_TIMEOUT:-300} $RUN "$G/inferno" bench offline --model $MX --device cuda --batch-size "$b" \
        --input-len "$i" --output-len "$o" --ignore-eos --quantization fp8 "$@" >"$log" 2>&1
      note "moe fp8 (Mixtral-shaped, ${MOE_FP8_LAYERS:-4} layers) offline batch=$b in=$i out=$o $*: rc=$? $(grep -E '^output throughput' "$log" | tail -1)"
      grep -E '^(TTFT|ITL|engine steps) ' "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
      grep -E 'weights uploaded|KV cache allocated|panicked|Error|error' "$log" | head -3 | sed 's/^/    /' >>"$SUMMARY"
      itl=$(grep -E '^ITL ' "$log" | awk '{print $3}')
      if [ -n "$itl" ] && [ "$b" = 1 ] && [ -n "$active" ]; then
        note "moe fp8 batch 1: ITL p50 $itl ms against the FP8 active-weight floor $(python3 -c "print(f'{$active/3.0e12*1e3:.3f} ms: {$active/3.0e12*1e3/$itl*100:.1f}% of the floor (target 75%)')")"
      fi
    done
  fi
fi

# gpt-oss on CUDA (issue 45). The attention kernels built with sinks (-DATTN_SINKS=1) against the
# float64 reference with per-head sinks, on a sliding layer's window and a full layer's none:
# gpt-oss-20b/120b's heads (64 q, 8 kv, head_dim 64: the decode kernel's tensor-core path, the
# prefill kernel's warpgroup geometry and its mma.sync small-tile one) and the tiny fixtures' (4 q,
# 2 kv, head_dim 16, window 8: the CUDA-core decode path), and an FP8 cache's build; memcheck over
# three of them. The expert kernels alone (.gpu/gptoss-check.cu, the tiny fixtures' shapes and a
# 2880-wide one of 8 experts): routing, the gate/up and down products over MXFP4 and bf16 experts,
# the combine and the output bias against float64 references, memcheck on the tiny build. Then
# tests/cuda_gpt_oss.rs (.gpu/cuda_gpt_oss: both tiny gpt-oss fixtures, MXFP4
# and bf16, against the CPU backend over 320 teacher-forced positions, prefill chunks and greedy
# tokens) and memcheck over its prefill test. Every step is bounded by timeout.
if has gptoss; then
  GO=$OUT/gptoss
  mkdir -p "$GO"
  GO_WG64="-DF_WGMMA=1 -DF_ROWS=128 -DF_KEYS=128 -DF_SHARED=115712"
  GO_MMA="-DF_WGMMA=0 -DF_ROWS=64 -DF_KEYS=32 -DF_SHARED=0"
  gptoss_build() { # NAME HARNESS Q KV HEAD_DIM WINDOW DEFINES
    timeout 300 nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I"$G/kernels" -DNUM_Q_HEADS=$3 -DNUM_KV_HEADS=$4 \
      -DHEAD_DIM=$5 -DSLIDING_WINDOW=$6 -DKV_BLOCK=16 -DATTN_SINKS=1 $ATTN_GEOMETRY -DATTN_MERGE_SPLITS=8 $7 \
      "$G/$2" -lcublas -o "$GO/$1" >"$GO/$1.build.log" 2>&1 || note "gptoss BUILD FAILED $1: $(grep -m2 error "$GO/$1.build.log")"
  }
  GO_BUILDS=(
    "attn-64-8-64-128 attention-check.cu 64 8 64 128"
    "attn-64-8-64-0 attention-check.cu 64 8 64 0"
    "attn-4-2-16-8 attention-check.cu 4 2 16 8"
    "attn-4-2-16-0 attention-check.cu 4 2 16 0"
    "attn-fp8-64-8-64-128 attention-check.cu 64 8 64 128 -DKV_FP8=1 -DATTN_DEPTH_FP8=2"
    "prefill-64-8-64-128 prefill-check.cu 64 8 64 128 $GO_WG64"
    "prefill-64-8-64-0 prefill-check.cu 64 8 64 0 $GO_WG64"
    "prefill-mma-64-8-64-128 prefill-check.cu 64 8 64 128 $GO_MMA"
    "prefill-4-2-16-8 prefill-check.cu 4 2 16 8 $GO_MMA"
    "prefill-fp8-64-8-64-128 prefill-check.cu 64 8 64 128 $GO_MMA -DKV_FP8=1"
  )
  for b in "${GO_BUILDS[@]}"; do
    set -- $b
    gptoss_build "$1" "$2" "$3" "$4" "$5" "$6" "${*:7}" &
  done
  experts_build() { # NAME HIDDEN EXPERTS INTER
    timeout 300 nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I"$G/kernels" -I"$G" -DHIDDEN=$2 \
      -DMOE_EXPERTS=$3 -DMOE_TOP_K=4 -DMOE_INTER=$4 -DGPTOSS_ALPHA=1.702f -DGPTOSS_LIMIT=7.0f -DINTERMEDIATE=$4 \
      -DMOE_RENORMALIZE=1 -DMOE_LOGITS=$3 -DMOE_SHARED_INTER=0 -DGEMV_ROWS=4 -DGEMV_WARPS=4 -DGEMV_MMA_FROM=1 \
      -DGEMV_MMA_WARPS=8 -DGEMV_MMA_STAGES=5 -DNUM_Q_HEADS=4 -DNUM_KV_HEADS=2 -DHEAD_DIM=16 -DQKV_BIAS=0 \
      "$G/gptoss-check.cu" -o "$GO/$1" >"$GO/$1.build.log" 2>&1 || note "gptoss BUILD FAILED $1: $(grep -m2 error "$GO/$1.build.log")"
  }
  experts_build experts-tiny 64 8 32 &
  experts_build experts-wide 2880 8 2880 &
  wait
  for name in experts-tiny experts-wide; do
    [ -x "$GO/$name" ] || continue
    timeout 120 "$GO/$name" test >"$GO/test-$name.log" 2>&1
    note "gptoss $name: rc=$? $(grep -h '^RESULT gptoss-check' "$GO/test-$name.log")"
    grep -h 'FAIL\|MISMATCH' "$GO/test-$name.log" | head -5 | tee -a "$SUMMARY"
  done
  if [ -x "$GO/experts-tiny" ]; then
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$GO/experts-tiny" test >"$GO/sanitizer-experts-tiny.log" 2>&1
    note "gptoss compute-sanitizer memcheck experts-tiny: rc=$? $(grep -E 'ERROR SUMMARY' "$GO/sanitizer-experts-tiny.log" | tail -1)"
  fi
  fails=0
  for b in "${GO_BUILDS[@]}"; do
    set -- $b
    [ -x "$GO/$1" ] || { fails=$((fails + 1)); continue; }
    timeout 60 "$GO/$1" test >"$GO/test-$1.log" 2>&1 || fails=$((fails + 1))
    grep -h '^RESULT' "$GO/test-$1.log" | sed "s/^/gptoss $1 /" >>"$SUMMARY" || note "gptoss test $1: no result"
    grep -h '^MISMATCH' "$GO/test-$1.log" | head -3 >>"$SUMMARY"
  done
  note "gptoss attention kernel tests with sinks: ${#GO_BUILDS[@]} builds, $fails failed"
  for name in attn-64-8-64-128 attn-4-2-16-8 prefill-64-8-64-128; do
    [ -x "$GO/$name" ] || continue
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$GO/$name" test >"$GO/sanitizer-$name.log" 2>&1
    note "gptoss compute-sanitizer memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY' "$GO/sanitizer-$name.log" | tail -1)"
  done
  if [ -x "$G/cuda_gpt_oss" ]; then
    timeout 240 $RUN "$G/cuda_gpt_oss" --include-ignored --test-threads=1 --nocapture >"$GO/correctness.log" 2>&1
    note "gptoss correctness (tests/cuda_gpt_oss.rs): rc=$? $(grep -E '^test result' "$GO/correctness.log")"
    grep -E '^RESULT|panicked' "$GO/correctness.log" | head -20 | tee -a "$SUMMARY"
    timeout 240 $RUN compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
      "$G/cuda_gpt_oss" --include-ignored --test-threads=1 prefill_logits >"$GO/sanitizer-tests.log" 2>&1
    note "gptoss compute-sanitizer memcheck (tests/cuda_gpt_oss.rs prefill_logits): rc=$? $(grep -E 'ERROR SUMMARY' "$GO/sanitizer-tests.log" | tail -1)"
  else
    note "gptoss: .gpu/cuda_gpt_oss missing (scripts/gpu-pack.sh builds it)"
  fi
  # GPTOSS_TTFT=1: the TTFT of a GPTOSS_PROMPT-token prompt (default 32768) on an idle engine
  # against its FLOP floor (issue 45's target: <= 2x), on gpt-oss-120b-shaped random MXFP4 weights
  # (make_gptoss_shaped.py, GPTOSS_LAYERS layers, default 8 of 36 for the disk and the time; the
  # floor is computed for the layers written). The prefill's experts take the grouped tile path.
  if [ -n "${GPTOSS_TTFT:-}" ]; then
    GM=${GPTOSS_MODEL_DIR:-/tmp/gptoss-shaped}
    prompt=${GPTOSS_PROMPT:-32768}
    PYTHONUNBUFFERED=1 timeout 600 python3 "$G/make_gptoss_shaped.py" $GM "${GPTOSS_LAYERS:-8}" --prompt $prompt >"$GO/make.log" 2>&1
    note "gpt-oss-shaped weights: rc=$? $(tail -1 "$GO/make.log")"
    floor=$(grep -o 'FLOP floor [0-9.]* s' "$GO/make.log" | grep -o '[0-9.]*' | head -1)
    [ -n "$floor" ] && note "gpt-oss $prompt-token prefill: $(grep -m1 '^prefill of' "$GO/make.log")"
    log=$GO/ttft-$prompt.log
    timeout ${GPTOSS_TTFT_TIMEOUT:-300} $RUN "$G/inferno" bench offline --model $GM --device cuda --batch-size 1 \
      --input-len $prompt --output-len 2 --ignore-eos >"$log" 2>&1
    note "gpt-oss-shaped (${GPTOSS_LAYERS:-8} layers) offline batch=1 in=$prompt out=2: rc=$? $(grep -E '^TTFT ' "$log" | tail -1)"
    grep -E 'weights uploaded|KV cache allocated|panicked|Error|error' "$log" | head -3 | sed 's/^/    /' >>"$SUMMARY"
    ttft=$(grep -E '^TTFT ' "$log" | awk '{print $3}')
    if [ -n "$ttft" ] && [ -n "$floor" ]; then
      note "gpt-oss TTFT p50 $ttft ms against the FLOP floor $(python3 -c "print(f'{$floor*1e3:.1f} ms: {$ttft/($floor*1e3):.2f}x (target <= 2x)')")"
    fi
  fi
fi

# kvgroups (issue 45: sliding layers give back the KV blocks their window left; the CUDA path has
# not run on a GPU yet): tests/cuda_gpt_oss.rs (.gpu/cuda_gpt_oss) with a block table per KV group
# (teacher-forced decode, prefill chunks and greedy tokens against the CPU backend) and the
# engine on a KV cache too small without freeing (its tokens against a large cache's and the CPU
# backend's). KVGROUPS_FILTER narrows the tests by name (default: all); KVGROUPS_SANITIZE=1 adds
# memcheck over the engine test (slow). Every step bounded.
if has kvgroups; then
  KO=$OUT/kvgroups
  mkdir -p "$KO"
  if [ -x "$G/cuda_gpt_oss" ]; then
    timeout 240 $RUN "$G/cuda_gpt_oss" --include-ignored --test-threads=1 --nocapture ${KVGROUPS_FILTER:-} >"$KO/tests.log" 2>&1
    note "kvgroups tests/cuda_gpt_oss.rs: rc=$? $(grep -E '^test result' "$KO/tests.log")"
    grep -E '^RESULT|panicked' "$KO/tests.log" | head -20 | tee -a "$SUMMARY"
    if [ "${KVGROUPS_SANITIZE:-0}" = 1 ]; then
      timeout 400 $RUN compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
        "$G/cuda_gpt_oss" --include-ignored --test-threads=1 the_engine_generates >"$KO/sanitizer.log" 2>&1
      note "kvgroups compute-sanitizer memcheck (engine test): rc=$? $(grep -E 'ERROR SUMMARY' "$KO/sanitizer.log" | tail -1)"
    fi
  else
    note "kvgroups: .gpu/cuda_gpt_oss missing (scripts/gpu-pack.sh builds it)"
  fi
fi

tar czf "$FINAL/results.tgz" -C "$OUT" .
cp "$SUMMARY" "$FINAL/summary.txt"
echo "===== summary"
cat "$SUMMARY"
