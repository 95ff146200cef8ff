#!/usr/bin/env python3
"""Makes tests/fixtures/tiny-qwen3-embedding: a Qwen3-Embedding-shaped model from tiny-qwen3.

The model is tiny-qwen3's configuration cut to one layer, with new random bf16 weights (seeded,
so the output is the same on every run), and the files that make a sentence-transformers
embedding model of it as Qwen3-Embedding publishes them:

- ``modules.json``: Transformer, then last-token Pooling (``1_Pooling``), then Normalize;
- ``1_Pooling/config.json``: ``pooling_mode_lasttoken``;
- ``config_sentence_transformers.json``: the query and document prompts, no default prompt;
- the tokenizer appends ``<|endoftext|>`` to every input (its post-processor), whose hidden
  state is the one pooled;
- ``config.json`` gains ``matryoshka_dimensions`` (vLLM's key), so ``dimensions`` may cut the
  64-wide embeddings to 16 or 32.

It also writes the same model as Qwen3-Embedding-0.6B/4B/8B publish their safetensors, to
``tests/fixtures/tiny-qwen3-embedding-published`` (or OUT_DIR-published): the tensors of the bare
transformer, named without the ``model.`` prefix (``embed_tokens.weight``, ``layers.0.…``,
``norm.weight``), no LM head and ``tie_word_embeddings: false`` (as the 8B's config says). Its
embeddings must equal the first directory's.

Usage: scripts/make_embedding_fixture.py [OUT_DIR]  (numpy only).
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import safetensors_io  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "fixtures" / "tiny-qwen3"
SEED = 46


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures" / "tiny-qwen3-embedding"
    write(out, published=False)
    write(out.with_name(out.name + "-published"), published=True)


def write(out, published):
    if out.exists():
        shutil.rmtree(out)
    (out / "1_Pooling").mkdir(parents=True)

    config = json.loads((SOURCE / "config.json").read_text())
    config["num_hidden_layers"] = 1
    config["layer_types"] = config["layer_types"][:1]
    config["matryoshka_dimensions"] = [16, 32, 64]
    if published:
        # The embedding matrix is not tied to an LM head that the files do not hold.
        config["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    rng = np.random.default_rng(SEED)
    tensors = {}
    for name, values in safetensors_io.read_bf16(SOURCE / "model.safetensors").items():
        if name.startswith("model.layers.") and not name.startswith("model.layers.0."):
            continue
        if name.endswith("norm.weight"):
            new = 1.0 + 0.1 * rng.standard_normal(values.shape)
        else:
            new = 0.1 * rng.standard_normal(values.shape)
        if published:
            if not name.startswith("model."):
                continue  # an LM head: the bare transformer has none
            name = name.removeprefix("model.")
        tensors[name] = ("BF16", values.shape, safetensors_io.bf16_bytes(new.astype(np.float32)))
    safetensors_io.write(out / "model.safetensors", tensors)

    tokenizer = json.loads((SOURCE / "tokenizer.json").read_text())
    eos = next(t for t in tokenizer["added_tokens"] if t["content"] == "<|endoftext|>")
    append_eos = {
        "type": "TemplateProcessing",
        "single": [
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
        ],
        "pair": [
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}},
        ],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [eos["id"]], "tokens": ["<|endoftext|>"]}
        },
    }
    tokenizer["post_processor"] = {
        "type": "Sequence",
        "processors": [tokenizer["post_processor"], append_eos],
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")))
    tokenizer_config = json.loads((SOURCE / "tokenizer_config.json").read_text())
    tokenizer_config["eos_token"] = "<|endoftext|>"
    tokenizer_config["padding_side"] = "left"
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    pooling = {
        "word_embedding_dimension": config["hidden_size"],
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True,
        "include_prompt": True,
    }
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    sentence_transformers = {
        "prompts": {
            "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
            "document": "",
        },
        "default_prompt_name": None,
        "similarity_fn_name": "cosine",
    }
    (out / "config_sentence_transformers.json").write_text(json.dumps(sentence_transformers, indent=2) + "\n")


if __name__ == "__main__":
    main()
