#!/usr/bin/env bash
# The project's test command (README.md): formatting and lints, every Rust test of the workspace,
# then the OpenAI Python client against a real server.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d ../shared ]; then
  echo "SKIPPED: ../shared is absent: the tests on the real attestation vectors are ignored (listed"
  echo "         as ignored, cfg shared_vectors), those on the shared tiny-llama3 fixture skip (each says"
  echo "         so with --nocapture); the rest run on committed data"
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The verifier builds without the simulated TEE (no test keys): what a production build links.
cargo clippy -p inferno-attestation --no-default-features --all-targets --locked -- -D warnings
cargo test --workspace --locked

if python3 -c "import openai, pytest" 2>/dev/null; then
  cargo build --locked
  target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  INFERNO_BIN="$target/debug/inferno" python3 -m pytest -q -rs tests/python
elif [ "${CI:-}" = true ]; then
  echo "error: the openai and pytest Python packages are required in CI" >&2
  exit 1
else
  echo "SKIPPED: tests/python needs the openai and pytest packages (pip install openai pytest)"
fi
