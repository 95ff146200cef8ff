# Stages of scripts/gpu-check.sh: moe, moefp8 (issue 44). Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
# Makes MoE-shaped random weights (make_moe_shaped.py with ARGS) and notes them and their
# active-weight floor at 3.0 TB/s; sets moe_active to the active bytes per decode token (empty if
# the maker did not print it).
moe_make_shaped() { # LOG LABEL ARGS...
  local log=$1 label=$2
  shift 2
  PYTHONUNBUFFERED=1 timeout 600 python3 "$G/make_moe_shaped.py" "$@" >"$log" 2>&1
  note "$label weights: $(tail -1 "$log")"
  moe_active=$(grep -o 'active bytes per decode token[^:]*: [0-9]*' "$log" | grep -o '[0-9]*$')
  [ -n "$moe_active" ] && note "$label active-weight floor: $(python3 -c "print(f'{$moe_active/1e9:.3f} GB per token: {$moe_active/3.0e12*1e3:.3f} ms at 3.0 TB/s')")"
}

# One `bench offline` run on MoE-shaped weights (a batch cN: a closed loop of N), noted with its
# latency lines and, at batch 1, its inter-token latency against the floor moe_make_shaped found;
# sets moe_itl to the ITL p50 in ms (empty without one). MOE_FLOOR_TARGET names the target share (default 75%).
moe_offline() { # LOG LABEL MODEL_DIR BATCH IN OUT [FLAGS...]
  local log=$1 label=$2 dir=$3 b=$4 i=$5 o=$6
  shift 6
  local load=(--batch-size "$b")
  [[ $b == c* ]] && load=(--concurrency "${b#c}")
  timeout "${MOE_BENCH_TIMEOUT:-300}" $RUN "$G/inferno" bench offline --model "$dir" --device cuda "${load[@]}" \
    --input-len "$i" --output-len "$o" --ignore-eos "$@" >"$log" 2>&1
  note "$label offline batch=$b in=$i out=$o $*: rc=$? $(grep -E '^output throughput' "$log" | tail -1)"
  grep -E '^(TTFT|ITL|engine steps) ' "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
  grep -E 'weights uploaded|KV cache allocated|panicked|Error|error' "$log" | head -3 | sed 's/^/    /' >>"$SUMMARY"
  moe_itl=$(grep -E '^ITL +[0-9]' "$log" | awk '{print $3}')
  if [ -n "$moe_itl" ] && [ "$b" = 1 ] && [ -n "$moe_active" ]; then
    note "$label batch 1: ITL p50 $moe_itl ms against the active-weight floor $(python3 -c "print(f'{$moe_active/3.0e12*1e3:.3f} ms: {$moe_active/3.0e12*1e3/$moe_itl*100:.1f}% of the floor (target ${MOE_FLOOR_TARGET:-75}%)')")"
  fi
}

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
    moe_make_shaped "$MO/make.log" "MoE-shaped" $MM "${MOE_LAYERS:-12}"
    IFS=';' read -ra MOE_SPEC_LIST <<<"${MOE_SPECS:-1 1000 256;64 1000 256}"
    for spec in "${MOE_SPEC_LIST[@]}"; do
      set -- $spec
      b=$1
      moe_offline "$MO/bench-b$b-i$2-o$3.log" "moe" $MM "$@" --json "$MO/bench-b$b-i$2-o$3.json"
      if [ -n "$moe_itl" ] && [[ $b == c* ]] && [ -n "$experts_256" ]; then
        note "moe $b: ITL p50 $moe_itl ms; expert products at 256 tokens $experts_256 us x ${MOE_LAYERS:-12} layers = $(python3 -c "e=$experts_256*${MOE_LAYERS:-12}/1e3; print(f'{e:.3f} ms: {e/$moe_itl*100:.1f}% of a decode step')")"
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
    moe_make_shaped "$MF/make.log" "Mixtral-shaped FP8" $MX "${MOE_FP8_LAYERS:-4}" --shape mixtral --fp8
    IFS=';' read -ra MF_SPEC_LIST <<<"${MOE_FP8_SPECS:-1 512 128}"
    for spec in "${MF_SPEC_LIST[@]}"; do
      set -- $spec
      moe_offline "$MF/bench-b$1-i$2-o$3.log" "moe fp8 (Mixtral-shaped, ${MOE_FP8_LAYERS:-4} layers)" $MX "$@" --quantization fp8
    done
  fi
fi
