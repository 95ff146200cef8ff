#!/usr/bin/env python3
"""Makes tiny models that carry the real Qwen3, Llama 3.1 and gpt-oss tokenizers, for the SDK
tests.

  make_real_tokenizer_models.py KIND OUT_DIR    (KIND: qwen3, llama3_1 or gpt-oss; numpy only)

The tokenizer files are the published ones, from ``tests/real-tokenizers/KIND``
(``scripts/fetch_real_tokenizers.sh``): ``tokenizer.json`` and ``tokenizer_config.json`` with its
chat template. The model is a one-layer cut of a committed fixture's configuration (``tiny-qwen3``
for Qwen3, ``inferno-tiny`` for Llama), widened to the real vocabulary (Qwen3's 151,936 logits,
Llama 3.1's 128,256) with tied embeddings and new seeded random bf16 weights, and the real
models' end-of-turn tokens (``<|im_end|>``; ``<|end_of_text|>``, ``<|eom_id|>``, ``<|eot_id|>``).
gpt-oss is a one-layer cut of ``tiny-gpt-oss-bf16`` with o200k_harmony (built by
``scripts/make_harmony_tokenizer.py``: 201,088 logits as the real config) and its stop tokens
(``<|return|>``, ``<|endoftext|>``, ``<|call|>``).
Its output is noise unless a grammar holds it; what the tests check is the shape of the API's
answers through tokenizers with the real added-token tables.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import safetensors_io  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KINDS = {
    # kind: (committed fixture, vocab_size, eos ids, bos id)
    "qwen3": ("tiny-qwen3", 151_936, [151_645, 151_643], None),
    "llama3_1": ("inferno-tiny", 128_256, [128_001, 128_008, 128_009], 128_000),
    "gpt-oss": ("tiny-gpt-oss-bf16", 201_088, [200_002, 199_999, 200_012], 199_998),
}
SEED = 4601


def write(kind, out):
    """Writes the tiny model with the real `kind` tokenizer into `out` (replaced if present)."""
    fixture, vocab, eos, bos = KINDS[kind]
    source = REPO / "tests" / "fixtures" / fixture
    tokenizers = REPO / "tests" / "real-tokenizers" / kind
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    config = json.loads((source / "config.json").read_text())
    config.update(num_hidden_layers=1, vocab_size=vocab, eos_token_id=eos, bos_token_id=bos,
                  tie_word_embeddings=True)
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:1]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}) + "\n")

    rng = np.random.default_rng(SEED)
    tensors = {}
    for name, values in safetensors_io.read_bf16(source / "model.safetensors").items():
        if name.startswith("model.layers.") and not name.startswith("model.layers.0."):
            continue
        if name == "lm_head.weight":
            continue
        shape = (vocab, values.shape[1]) if name == "model.embed_tokens.weight" else values.shape
        if name.endswith("norm.weight"):
            new = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            new = 0.1 * rng.standard_normal(shape)
        tensors[name] = ("BF16", shape, safetensors_io.bf16_bytes(new.astype(np.float32)))
    safetensors_io.write(out / "model.safetensors", tensors)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizers / name, out / name)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in KINDS:
        sys.exit(__doc__)
    print(write(sys.argv[1], sys.argv[2]))
