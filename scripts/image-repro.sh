#!/usr/bin/env bash
# scripts/image-repro.sh [WORKDIR]: build the image twice from the same inputs (same commit,
# SOURCE_DATE_EPOCH, seed and inferno binary) and compare the SHA-256 of every artifact. Both
# builds run in OUTDIR (default image/out, whose mkosi tools tree they share); the artifacts of
# each are copied to WORKDIR/a and WORKDIR/b (default image/out-repro). Exits 0 only if all are
# bit-identical; otherwise names the artifacts that differ.
# Environment: as image/build (INFERNO_BIN, IMAGE_PROFILE, MKOSI), and OUTDIR. Set INFERNO_BIN:
# without it each build compiles its own binary, and a Rust build is not reproducible here (the
# binary embeds its build paths).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(realpath -m "${1:-$here/image/out-repro}")
out=$(realpath -m "${OUTDIR:-$here/image/out}")
name=inferno
[ "${IMAGE_PROFILE:-}" = development ] && name=inferno-development
for run in a b; do
    "$here/image/build" "$out" >/dev/null
    rm -rf "${work:?}/$run"
    mkdir -p "$work/$run"
    cp "$out/$name".* "$work/$run/"
done
if diff <(cat "$work/a/$name.SHA256SUMS") <(cat "$work/b/$name.SHA256SUMS"); then
    echo "REPRODUCIBLE: $(wc -l <"$work/a/$name.SHA256SUMS") artifacts bit-identical"
else
    echo "NOT REPRODUCIBLE: the artifacts above differ" >&2
    exit 1
fi
