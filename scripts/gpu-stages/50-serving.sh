# Stages of scripts/gpu-check.sh: serve, ohttp. Sourced by gpu-check.sh in file-name order,
# which is the order the stages run in; it defines note, has, RUN, G, OUT and SUMMARY.
# shellcheck shell=bash

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
