#!/bin/bash
# On the GPU machine: `inferno serve --device cuda` with the embedded model in the development
# profile (start-up GPU gate, CUDA serving over HTTPS, /v1/attestation), a clean SIGTERM exit,
# and a policy that requires CC mode on a GPU that is not in it (start-up must refuse).
#   DIR: a folder with the `inferno` binary and, when the machine lacks them, lib.tar.xz holding
#        lib/ with libxmlsec1, libxml2 and their dependencies (the binary links them).
set -u
DIR=${1:-.gpu/lead}
mkdir -p /tmp/inferno-lib && [ -f "$DIR/lib.tar.xz" ] && tar -xJf "$DIR/lib.tar.xz" -C /tmp/inferno-lib
B="env LD_LIBRARY_PATH=/tmp/inferno-lib/lib $DIR/inferno"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi conf-compute -f 2>&1 | head -3
echo "== serve --device cuda, development profile"
$B serve --device cuda --listen 127.0.0.1:8443 > /tmp/serve.log 2>&1 &
PID=$!
for i in $(seq 1 60); do [ "$(curl -sk -o /dev/null -w "%{http_code}" https://127.0.0.1:8443/health)" = 200 ] && break; sleep 1; done
grep -E "attestation|backend|kv cache|policy|GPU|gpu" /tmp/serve.log | head -12
curl -sk https://127.0.0.1:8443/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"inferno-tiny","max_tokens":40,"temperature":0,"messages":[{"role":"user","content":"What is confidential computing?"}]}'
echo
curl -sk https://127.0.0.1:8443/v1/attestation | python3 -c 'import json,sys; d=json.load(sys.stdin); print("gpu section:", "gpu" in d["evidence"], [c["id"]+":"+str(c["passed"]) for c in d["appraisal"]["checks"] if c["id"].startswith("gpu")])' 2>&1 | tail -2
kill $PID; wait $PID; echo "serve exit $?"
echo "== a policy that requires CC mode"
sed 's/^require_cc_mode = false/require_cc_mode = true/' policy/development.toml > /tmp/cc.toml
grep -n require_cc_mode /tmp/cc.toml
printf '[attestation]\nprofile = "development"\npolicy = "/tmp/cc.toml"\n[server]\nlisten = "127.0.0.1:8444"\n' > /tmp/cc-config.toml
timeout 60 $B serve --device cuda --config /tmp/cc-config.toml 2>&1 | grep -E "^error|refus" | head -3
echo "serve exit ${PIPESTATUS[0]}"
nvidia-smi conf-compute -grs 2>&1 | head -2
