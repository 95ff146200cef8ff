#!/usr/bin/env bash
# Host CPU per output token of the serving path, on any Linux machine (no GPU): `inferno serve`
# on the CPU backend with the embedded tiny model (its steps are short, so the host work per
# token is visible), driven by `inferno bench serve` over HTTPS at concurrency 64, the server's
# CPU split by thread group (tokio = HTTP/TLS/JSON/SSE, engine = the engine thread, rayon = the
# CPU backend's products; the engine thread's own host work apart from its time inside backend
# steps, from the server's /metrics). Several binaries are run alternately, round after round, so a noisy
# machine hurts them alike.
#
#   scripts/host-cpu.sh OUTDIR BIN [BIN...]
#   env: ROUNDS (3), CONCURRENCY (64), PROMPTS (128), INPUT_LEN (32), OUTPUT_LEN (512),
#        BENCH (the binary that drives the load: the first BIN), PORT (8611)
set -euo pipefail
OUT=${1:?usage: host-cpu.sh OUTDIR BIN [BIN...]}
shift
[ $# -ge 1 ] || { echo "host-cpu.sh: name at least one inferno binary" >&2; exit 2; }
ROUNDS=${ROUNDS:-3} CONCURRENCY=${CONCURRENCY:-64} PROMPTS=${PROMPTS:-128}
INPUT_LEN=${INPUT_LEN:-32} OUTPUT_LEN=${OUTPUT_LEN:-512} PORT=${PORT:-8611}
BENCH=${BENCH:-$1}
mkdir -p "$OUT"
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null; true; }
trap cleanup EXIT
for round in $(seq 1 "$ROUNDS"); do
  i=0
  for bin in "$@"; do
    i=$((i + 1))
    RUST_LOG=warn "$bin" serve --device cpu --listen 127.0.0.1:$PORT >"$OUT/serve-$i.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 100); do
      curl -skf https://127.0.0.1:$PORT/health >/dev/null 2>&1 && break
      sleep 0.2
    done
    "$BENCH" bench serve --url https://127.0.0.1:$PORT --model inferno-tiny --insecure \
      --concurrency "$CONCURRENCY" --num-prompts "$PROMPTS" --input-len "$INPUT_LEN" \
      --output-len "$OUTPUT_LEN" --ignore-eos --seed "$round" --server-pid "$SERVER" \
      --json "$OUT/run-$round-$i.json" >"$OUT/run-$round-$i.log" 2>&1
    cleanup
    SERVER=
    python3 - "$OUT/run-$round-$i.json" "$bin" "$round" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
g = {t["group"]: t for t in r.get("server_threads", [])}
ms = lambda k: g.get(k, {}).get("ms_per_output_token") or 0.0
e = {t["group"]: t for t in r.get("engine_split", [])}
host = e.get("engine host work", {}).get("ms_per_output_token")
serving = ms("tokio") + ms("other") + ms("exited") + (host if host is not None else ms("engine"))
print(f"round {sys.argv[3]} {sys.argv[2]}: {r['output_token_throughput']:.0f} tok/s, "
      f"{r['failed']} failed, ms CPU/token: total {r['cpu_ms_per_output_token']:.4f} "
      f"tokio {ms('tokio'):.4f} engine {ms('engine'):.4f} "
      f"(host work {'n/a' if host is None else f'{host:.4f}'}) rayon {ms('rayon'):.4f} "
      f"other+exited {ms('other') + ms('exited'):.4f} | serving path {serving:.4f}")
PY
  done
done | tee "$OUT/summary.txt"
