#!/usr/bin/env bash
# Runs the proptest fuzz targets of the server and of the audit log (stable toolchain), then every cargo-fuzz target of
# attestation/fuzz, each for a bounded time.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). A crash leaves its input
# under attestation/fuzz/artifacts/<target>/; turn it into a regression test before fixing it.
set -euo pipefail
secs=${1:-60}
cd "$(dirname "$0")/.."

# Proptest-driven targets on the stable toolchain: the OpenAI request parser and the chat-template
# rendering (tests/fuzz_server_input.rs). Each property runs with a huge case count until the time
# is up (exit 124 is a pass). A failing input is shrunk and written to
# tests/fuzz_server_input.proptest-regressions: commit it, it is replayed first by every later run.
exe=$(cargo test --locked --test fuzz_server_input --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
proptest_failed=0
for t in arbitrary_bytes_never_crash_the_parser arbitrary_json_never_crashes_the_parser \
  request_shaped_json_never_crashes_the_parser chat_templates_render_or_refuse_any_conversation; do
  echo "== fuzzing $t (proptest) for ${secs}s"
  rc=0
  PROPTEST_CASES=1000000000 timeout "$secs" "$exe" --exact "$t" --quiet || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; then
    echo "!! $t found a failure (see tests/fuzz_server_input.proptest-regressions)" >&2
    proptest_failed=$((proptest_failed + 1))
  fi
done
# The sealed-model manifest parser (src/seal/manifest.rs): its two properties, many cases each.
echo "== fuzzing the sealed-model manifest parser (proptest) for ${secs}s"
rc=0
PROPTEST_CASES=1000000000 timeout "$secs" cargo test --locked --lib --quiet -- \
  seal::manifest::tests::parser_survives || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; then
  echo "!! the manifest parser failed a property" >&2
  proptest_failed=$((proptest_failed + 1))
fi
audit_exe=$(cargo test --locked -p inferno-audit --test fuzz_audit_input --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
for t in flipped_bytes_are_detected_and_never_crash cut_or_grown_files_never_crash_verify_or_read \
  arbitrary_notes_checkpoints_and_keys_never_crash a_changed_signed_checkpoint_never_verifies; do
  echo "== fuzzing the audit log's $t (proptest) for ${secs}s"
  rc=0
  PROPTEST_CASES=1000000000 timeout "$secs" "$audit_exe" --exact "$t" --quiet || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; then
    echo "!! $t found a failure (see audit/tests/fuzz_audit_input.proptest-regressions)" >&2
    proptest_failed=$((proptest_failed + 1))
  fi
done
echo "proptest targets: $proptest_failed with failures"
[ "$proptest_failed" -eq 0 ] || exit 1

cd attestation/fuzz
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
