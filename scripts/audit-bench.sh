#!/usr/bin/env bash
# Audit-log benchmarks: writer throughput (group commit + fsync) and the serving throughput of
# the real server with and without the audit log. Release build; prints the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test audit_bench -- --ignored --nocapture --test-threads 1 "$@"
