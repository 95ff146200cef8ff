# Stages of scripts/gpu-check.sh: auditbench, fp8kv, peers. Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
