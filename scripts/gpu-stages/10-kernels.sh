# Stages of scripts/gpu-check.sh: attention, gemv, chain, prefillattn: kernels alone, built with nvcc. Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
