# Stages of scripts/gpu-check.sh: sampling, profile, graphs, prefill. Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
