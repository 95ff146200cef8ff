# Stages of scripts/gpu-check.sh: spec (issue 51). Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
