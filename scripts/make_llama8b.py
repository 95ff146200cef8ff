#!/usr/bin/env python3
"""Writes a Llama-3.1-8B-shaped model directory with random bf16 weights, for benchmarks.

The config and tensor names are Llama-3.1-8B's; the values are random (normal, std 0.02; norm
weights 1), generated on the GPU with a fixed seed. The tokenizer is synthetic: a word-level vocabulary
of 128000 words ("hello" is one of them) plus Llama 3's special tokens at their ids, so every id the
random model emits decodes to text. Usage: make_llama8b.py OUT_DIR
"""
import json
import os
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


def write_tokenizer(out):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(128000)}
    del vocab["w1000"]
    vocab["hello"] = 1000
    special = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>"}
    for i in range(128000, 128256):
        vocab[special.get(i, f"<|reserved_special_token_{i - 128000}|>")] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in special.values()])
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, f)


def main():
    out = sys.argv[1]
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
    write_tokenizer(out)
    print(f"wrote {out} in {time.time() - started:.1f}s")


if __name__ == "__main__":
    main()
