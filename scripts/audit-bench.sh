#!/usr/bin/env bash
# Audit-log benchmarks: writer throughput (group commit + fsync) and the serving throughput of
# the real server with and without the audit log. Release build; prints the figures.
#
#   scripts/audit-bench.sh serving_throughput          # the cost of the log at saturation
#   AUDIT_BENCH_PAIRS=20 scripts/audit-bench.sh ...    # more measurement pairs (default 12)
#   AUDIT_BENCH_CALIBRATE=1 scripts/audit-bench.sh serving_throughput
#                                                      # both sides without the log: noise floor
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test audit_bench -- --ignored --nocapture --test-threads 1 "$@"
