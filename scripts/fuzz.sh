#!/usr/bin/env bash
# Runs the sealed-model manifest parser's property tests with many cases (stable toolchain), then
# every cargo-fuzz target of attestation/fuzz for a bounded time each.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). A crash leaves its input
# under attestation/fuzz/artifacts/<target>/; turn it into a regression test before fixing it.
set -euo pipefail
secs=${1:-60}
root="$(cd "$(dirname "$0")/.." && pwd)"
echo "== sealed-model manifest parser: proptest with ${SEAL_FUZZ_CASES:=200000} cases"
(cd "$root" && PROPTEST_CASES="$SEAL_FUZZ_CASES" cargo test --lib -- seal::manifest::tests::parser_survives)
cd "$root/attestation/fuzz"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz on a nightly toolchain is required: rustup toolchain install nightly && cargo install cargo-fuzz" >&2
  exit 2
fi
# The fuzz crate is its own workspace; keep its build apart from the main target directory.
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/target}"
targets=$(cargo +nightly fuzz list)
failed=0
for t in $targets; do
  echo "== fuzzing $t for ${secs}s"
  mkdir -p "corpus/$t"
  if ! cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048; then
    echo "!! $t found a failure (see artifacts/$t/)" >&2
    failed=$((failed + 1))
  fi
done
echo "fuzzed $(echo "$targets" | wc -w) targets, $failed with failures"
[ "$failed" -eq 0 ]
