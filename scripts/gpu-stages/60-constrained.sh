# Stages of scripts/gpu-check.sh: constrained, embed, constrainedqwen (issues 16 and 46). Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
# Starts `inferno serve` with CONFIG on DEVICE at 127.0.0.1:PORT in the background (ARGS: the model
# and other flags), its log in $OUT/serve-DEVICE-PORT.log; prints its pid.
serve_dev() { # CONFIG DEVICE PORT [ARGS...]
  local config=$1 device=$2 port=$3
  shift 3
  RUST_LOG=warn $RUN "$G/inferno" serve --config "$config" "$@" --device "$device" --listen 127.0.0.1:$port >"$OUT/serve-$device-$port.log" 2>&1 &
  echo $!
}
# Waits up to 240 s for the server on PORT (process PID) to answer /health; otherwise notes, under
# LABEL, the tail of its log and fails.
wait_up() { # PORT PID LABEL
  for _ in $(seq 1 240); do
    curl -ksf "https://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 1
  done
  note "$3: the server on port $1 did not come up: $(tail -3 "$OUT"/serve-*-"$1".log | tr '\n' ' ')"
  return 1
}

if has constrained; then
  # Development profile (simulated TEE) as without a config; the embedded model's template shows
  # no tool-call markers, so the format is named for the tool_required case.
  printf '[attestation]\nprofile = "development"\n[server]\ntool_call_parser = "hermes"\n' >/tmp/constrained-dev.toml
  CPU_PID=$(serve_dev /tmp/constrained-dev.toml cpu 8450)
  GPU_PID=$(serve_dev /tmp/constrained-dev.toml cuda 8451)
  if wait_up 8450 "$CPU_PID" constrained && wait_up 8451 "$GPU_PID" constrained; then
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
  B8_PID=$(serve_dev /tmp/constrained-dev.toml cuda 8452 --model $M8B)
  if wait_up 8452 "$B8_PID" constrained; then
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
# The development profile (simulated TEE), as without a config, for the issue-46 stages.
printf '[attestation]\nprofile = "development"\n' >/tmp/dev46.toml
if has embed; then
  for fixture in tiny-qwen3-embedding tiny-qwen3-embedding-published; do
    CPU46=$(serve_dev /tmp/dev46.toml cpu 8460 --model "$PWD/tests/fixtures/$fixture")
    GPU46=$(serve_dev /tmp/dev46.toml cuda 8461 --model "$PWD/tests/fixtures/$fixture")
    if wait_up 8460 "$CPU46" "issue 46" && wait_up 8461 "$GPU46" "issue 46"; then
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
  QPID=$(serve_dev /tmp/dev46.toml cuda 8462 --model $Q8)
  if wait_up 8462 "$QPID" "issue 46"; then
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
