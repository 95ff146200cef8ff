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
bins+=$'\n'$(test_bins --test cuda_moe | sed 's/^test /moe /')
bins+=$'\n'$(test_bins --test cuda_kv_fp8 | sed 's/^test /kvfp8 /')
bins+=$'\n'$(test_bins --test audit_bench | sed 's/^test /audit /')
# Issue 51: per-position logits and speculative decoding on CUDA (the spec stage).
bins+=$'\n'$(test_bins --test cuda_speculative | sed 's/^test /spec /')
# Issue 45: gpt-oss on CUDA (the gptoss stage).
bins+=$'\n'$(test_bins --test cuda_gpt_oss | sed 's/^test /gptoss /')
# The library's unit tests are optional here (another area's test may not build mid-merge);
# PACK_NO_UNIT=1 leaves them out (the unit stage then does not run).
[ -n "${PACK_NO_UNIT:-}" ] || bins+=$'\n'$(test_bins --lib || true)
mkdir -p "$DEST"
cp "$CARGO_TARGET_DIR/release/inferno" "$DEST/inferno"
rm -f "$DEST/unit_tests" "$DEST/cuda_backend" "$DEST/cuda_fp8" "$DEST/cuda_moe" "$DEST/cuda_kv_fp8" "$DEST/audit_bench" "$DEST/cuda_speculative"
rm -f "$DEST/cuda_gpt_oss"
while read -r kind path; do
  case $kind in
    lib) cp "$path" "$DEST/unit_tests" ;;
    test) cp "$path" "$DEST/cuda_backend" ;;
    fp8) cp "$path" "$DEST/cuda_fp8" ;;
    moe) cp "$path" "$DEST/cuda_moe" ;;
    kvfp8) cp "$path" "$DEST/cuda_kv_fp8" ;;
    audit) cp "$path" "$DEST/audit_bench" ;;
    spec) cp "$path" "$DEST/cuda_speculative" ;;
    gptoss) cp "$path" "$DEST/cuda_gpt_oss" ;;
    *) ;;
  esac
done <<<"$bins"
cp scripts/gpu-check.sh scripts/make_llama8b.py scripts/peers.py scripts/attention-check.cu scripts/gemv-check.cu scripts/fp8-check.cu scripts/fp8_reference.py scripts/moe-check.cu scripts/moe-fp8-check.cu scripts/make_moe_shaped.py scripts/prefill-check.cu scripts/sampling-check.cu scripts/decode-chain-check.cu scripts/check-common.cuh scripts/moe-check-common.cuh scripts/attention-reference.cuh scripts/kv-check.cuh scripts/gptoss-check.cu scripts/make_gptoss_shaped.py scripts/constrained_check.py scripts/read-buffer-bench.c scripts/libload-probe.py "$DEST/"
rm -rf "$DEST/kernels" && cp -r kernels "$DEST/kernels"
rm -rf "$DEST/gpu-stages" && cp -r scripts/gpu-stages "$DEST/gpu-stages"
# Issue 46: the embed and constrainedqwen stages' script and the real Qwen3 tokenizer (git-ignored:
# scripts/fetch_real_tokenizers.sh fetches it).
cp scripts/embed_check.py "$DEST/"
tar -cJf "$DEST/qwen3-tokenizer.tar.xz" -C tests/real-tokenizers/qwen3 tokenizer.json tokenizer_config.json ||
  echo "warning: tests/real-tokenizers/qwen3 missing: the embed and constrainedqwen stages cannot run" >&2
git rev-parse --short HEAD >"$DEST/BUILD_COMMIT"
# The audit benchmark spawns the server binary at the path compiled into it.
echo "$CARGO_TARGET_DIR/release/inferno" >"$DEST/INFERNO_BIN_PATH"
git diff --quiet HEAD -- src kernels tests Cargo.toml || echo "+uncommitted" >>"$DEST/BUILD_COMMIT"
strip "$DEST"/inferno "$DEST"/cuda_backend "$DEST"/cuda_fp8 "$DEST"/cuda_moe "$DEST"/cuda_kv_fp8 "$DEST"/audit_bench "$DEST"/cuda_speculative "$DEST"/cuda_gpt_oss 2>/dev/null || true
[ -f "$DEST/unit_tests" ] && strip "$DEST/unit_tests"
[ -f "$DEST/cuda_backend" ] || { echo "cuda_backend test binary missing" >&2; exit 1; }
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
bins=$(cd "$DEST" && ls inferno* unit_tests cuda_backend cuda_fp8 cuda_moe cuda_kv_fp8 audit_bench cuda_speculative cuda_gpt_oss 2>/dev/null | grep -v '\.tar\.xz$' || true)
tar -cJf "$DEST/bins.tar.xz" -C "$DEST" $bins && (cd "$DEST" && rm -f $bins)
du -sh "$DEST"
