# Stages of scripts/gpu-check.sh: the 8B-shaped model for the model-level stages; bench, quickbench. Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
