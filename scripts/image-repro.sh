#!/usr/bin/env bash
# scripts/image-repro.sh [WORKDIR]: build the image twice from the same inputs (same commit,
# SOURCE_DATE_EPOCH, seed and inferno binary) into WORKDIR/a and WORKDIR/b, and compare the
# SHA-256 of every artifact. Exits 0 only if all are bit-identical.
# Environment: as image/build (INFERNO_BIN, IMAGE_PROFILE, MKOSI).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(realpath -m "${1:-$here/image/out-repro}")
name=inferno
[ "${IMAGE_PROFILE:-}" = development ] && name=inferno-development
"$here/image/build" "$work/a" >/dev/null
"$here/image/build" "$work/b" >/dev/null
if diff <(cd "$work/a" && cat "$name.SHA256SUMS") <(cd "$work/b" && cat "$name.SHA256SUMS"); then
    echo "REPRODUCIBLE: $(wc -l <"$work/a/$name.SHA256SUMS") artifacts bit-identical"
else
    echo "NOT REPRODUCIBLE: the artifacts above differ" >&2
    exit 1
fi
