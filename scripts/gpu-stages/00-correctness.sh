# Stages of scripts/gpu-check.sh: env, unit, correctness, sanitizer. Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
