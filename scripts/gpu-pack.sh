#!/usr/bin/env bash
# Builds the release binary, the CUDA test binaries and the audit benchmark here, and copies them with the GPU scripts
# into DEST/.gpu (default: /work/main/.gpu, a git-ignored folder that the device tool carries).
# Usage: [PACK_NO_UNIT=1] scripts/gpu-pack.sh [DEST_REPO]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-/work/main}/.gpu
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target}
cd "$ROOT"
cargo build --release --bin inferno
test_bins() {
  cargo test --release --no-run --message-format=json "$@" 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] in (["lib"], ["test"]):
        print(m["target"]["kind"][0], m["executable"])'
}
bins=$(test_bins --test cuda_backend)
bins+=$'\n'$(test_bins --test cuda_fp8 | sed 's/^test /fp8 /')
bins+=$'\n'$(test_bins --test audit_bench | sed 's/^test /audit /')
# The library's unit tests are optional here (another area's test may not build mid-merge);
# PACK_NO_UNIT=1 leaves them out (the unit stage then does not run).
[ -n "${PACK_NO_UNIT:-}" ] || bins+=$'\n'$(test_bins --lib || true)
mkdir -p "$DEST"
cp "$CARGO_TARGET_DIR/release/inferno" "$DEST/inferno"
rm -f "$DEST/unit_tests" "$DEST/cuda_backend" "$DEST/cuda_fp8" "$DEST/audit_bench"
while read -r kind path; do
  case $kind in
    lib) cp "$path" "$DEST/unit_tests" ;;
    test) cp "$path" "$DEST/cuda_backend" ;;
    fp8) cp "$path" "$DEST/cuda_fp8" ;;
    audit) cp "$path" "$DEST/audit_bench" ;;
    *) ;;
  esac
done <<<"$bins"
cp scripts/gpu-check.sh scripts/make_llama8b.py scripts/peers.py scripts/attention-check.cu scripts/gemv-check.cu scripts/fp8-check.cu scripts/prefill-check.cu scripts/sampling-check.cu scripts/decode-chain-check.cu scripts/check-common.cuh scripts/attention-reference.cuh scripts/constrained_check.py scripts/read-buffer-bench.c scripts/libload-probe.py "$DEST/"
rm -rf "$DEST/kernels" && cp -r kernels "$DEST/kernels"
git rev-parse --short HEAD >"$DEST/BUILD_COMMIT"
# The audit benchmark spawns the server binary at the path compiled into it.
echo "$CARGO_TARGET_DIR/release/inferno" >"$DEST/INFERNO_BIN_PATH"
git diff --quiet HEAD -- src kernels tests Cargo.toml || echo "+uncommitted" >>"$DEST/BUILD_COMMIT"
strip "$DEST"/inferno "$DEST"/cuda_backend "$DEST"/cuda_fp8 "$DEST"/audit_bench 2>/dev/null || true
[ -f "$DEST/unit_tests" ] && strip "$DEST/unit_tests"
[ -f "$DEST/cuda_backend" ] || { echo "cuda_backend test binary missing" >&2; exit 1; }
# The FP8 stage's PyTorch reference (issue 43).
cp scripts/fp8_reference.py "$DEST/"
# The binaries link libxmlsec1, libxml2 (and their dependencies) dynamically; the GPU machine may
# lack them. Carry this machine's copies, except the C/C++ runtime and compression libraries that
# every system has (gpu-check.sh puts them on LD_LIBRARY_PATH for these binaries only).
LIBTMP=$(mktemp -d)
mkdir -p "$LIBTMP/lib"
ldd "$DEST/inferno" | awk '$3 ~ /^\// {print $3}' |
  grep -vE '/(libc|libm|libgcc_s|libstdc\+\+|libz|liblzma|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
  while read -r lib; do cp -L "$lib" "$LIBTMP/lib/"; done
tar -cJf "$DEST/lib.tar.xz" -C "$LIBTMP" lib
rm -rf "$LIBTMP"
# The device tool carries at most 64 MiB: the binaries travel xz-compressed (gpu-check.sh unpacks
# them), with any other build beside them (e.g. inferno-base for BENCH_BINS="inferno inferno-base").
bins=$(cd "$DEST" && ls inferno* unit_tests cuda_backend cuda_fp8 audit_bench 2>/dev/null | grep -v '\.tar\.xz$' || true)
tar -cJf "$DEST/bins.tar.xz" -C "$DEST" $bins && (cd "$DEST" && rm -f $bins)
du -sh "$DEST"
