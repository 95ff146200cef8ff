#!/usr/bin/env python3
"""Writes a Llama-3.1-8B-shaped model directory with random bf16 weights, for benchmarks.

The config and tensor names are Llama-3.1-8B's; the values are random (normal, std 0.02; norm
weights 1), generated on the GPU with a fixed seed. The tokenizer files are copied from a Llama 3
fixture (same 128256-token vocabulary). Usage: make_llama8b.py OUT_DIR TOKENIZER_DIR
"""
import json
import os
import shutil
import sys
import time

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}


def shapes(c):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d, q, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    yield "model.embed_tokens.weight", (v, h)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield f"{p}.self_attn.q_proj.weight", (q * d, h)
        yield f"{p}.self_attn.k_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.v_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.o_proj.weight", (h, q * d)
        yield f"{p}.post_attention_layernorm.weight", (h,)
        yield f"{p}.mlp.gate_proj.weight", (i, h)
        yield f"{p}.mlp.up_proj.weight", (i, h)
        yield f"{p}.mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def main():
    out, tok = sys.argv[1], sys.argv[2]
    if os.path.exists(os.path.join(out, "model.safetensors.index.json")):
        print(f"{out} exists; reusing it")
        return
    os.makedirs(out, exist_ok=True)
    started = time.time()
    gen = torch.Generator(device="cuda").manual_seed(1234)
    shard, shard_bytes, index, n = {}, 0, {}, 0
    limit = 5 << 30

    def flush():
        nonlocal shard, shard_bytes, n
        if not shard:
            return
        n += 1
        name = f"model-{n:05d}.safetensors"
        save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
        for k in shard:
            index[k] = name
        shard, shard_bytes = {}, 0

    for name, shape in shapes(CONFIG):
        if len(shape) == 1:
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()
        shard[name] = t
        shard_bytes += t.numel() * 2
        if shard_bytes >= limit:
            flush()
    flush()
    # Rename shards to the HF "-of-" pattern now that the count is known.
    total = n
    renamed = {}
    for k, v in index.items():
        new = v.replace(".safetensors", f"-of-{total:05d}.safetensors")
        renamed[k] = new
    for i in range(1, total + 1):
        os.rename(os.path.join(out, f"model-{i:05d}.safetensors"), os.path.join(out, f"model-{i:05d}-of-{total:05d}.safetensors"))
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": renamed}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": False}, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(tok, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(out, name))
    print(f"wrote {out} in {time.time() - started:.1f}s")


if __name__ == "__main__":
    main()
