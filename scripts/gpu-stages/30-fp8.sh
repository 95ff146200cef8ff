# Stages of scripts/gpu-check.sh: fp8 (issue 43). Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
    # FP8_KERNELS=0: not the kernels alone (the backend's checks only).
    if [ "${FP8_KERNELS:-1}" != 0 ]; then
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
    grep -E '^RESULT|panicked' "$OUT/fp8.log" | head -100 | tee -a "$SUMMARY"
    if [ "${FP8_SANITIZE:-1}" = 1 ]; then
      INFERNO_FP8_MODELS=${FP8_SANITIZE_MODELS:-block,inferno-tiny} INFERNO_FP8_POSITIONS=64 timeout 300 $RUN compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
        "$G/cuda_fp8" --include-ignored --test-threads=1 fp8_teacher_forced_logits_match_the_cpu_reference >"$OUT/fp8-sanitizer.log" 2>&1
      note "compute-sanitizer memcheck (tests/cuda_fp8.rs, ${FP8_SANITIZE_MODELS:-block,inferno-tiny}, 64 positions): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/fp8-sanitizer.log" | tail -1)"
    fi
  fi
  # FP8_SPECS=none: no bench (the checks alone).
  [ "${FP8_SPECS:-}" = none ] || [ -d $M8 ] || PYTHONUNBUFFERED=1 python3 "$G/make_llama8b.py" $M8 >"$OUT/make8b.log" 2>&1
  # "1 8192 4": the 8k prompt on an idle engine, whose TTFT the issue bounds at 0.6 x bf16's.
  # Concurrency 256 at 1000/1000 runs with the FP8 KV cache in both arms: with a bf16 cache its
  # decode steps read about 50 GB of keys and values (256 rows x 1,500 positions x 128 KiB), 16 ms
  # at 3.0 TB/s, more than the 16.5 ms a step may take for 15,500 tok/s, whatever the weights.
  FP8_SPECS=${FP8_SPECS:-"1 1000 256;1 8192 4;64 1000 256;c256 1000 1000 --num-prompts ${FP8_C256_PROMPTS:-1024} --kv-cache-dtype fp8"}
  IFS=';' read -ra FP8_LIST <<<"$FP8_SPECS"
  [ "$FP8_SPECS" = none ] && FP8_LIST=()
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
