#!/usr/bin/env python3
"""Writes a Llama-3.1-8B-shaped model directory with random bf16 weights, for benchmarks.

The config and tensor names are Llama-3.1-8B's; the values are random (normal, std 0.02; norm
weights 1), generated on the GPU with a fixed seed. The tokenizer is synthetic: a word-level vocabulary
of 128000 words ("hello" is one of them) plus Llama 3's special tokens at their ids, so every id the
random model emits decodes to text. Usage: make_llama8b.py OUT_DIR

With --qwen3-embedding TOKENIZER_DIR, it writes a Qwen3-Embedding-8B-shaped model instead (issue
46): Qwen3-8B's configuration (36 layers, hidden 4096, q/k norms, vocab 151936), the tensors named
as Qwen3-Embedding publishes them (no `model.` prefix), the sentence-transformers files
(modules.json, 1_Pooling/config.json with last-token pooling, Normalize,
config_sentence_transformers.json) and the real Qwen3 tokenizer.json / tokenizer_config.json
from TOKENIZER_DIR. Unlike the published 8B (untied, no LM head), its embedding matrix is tied
to an LM head, as Qwen3-Embedding-0.6B's is, so the same weights also generate: the GPU stages
compare an embedding run with a prefill of the same tokens, and measure structured output with
the real tokenizer's 151k vocabulary. Usage: make_llama8b.py --qwen3-embedding TOKENIZER_DIR OUT_DIR
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


QWEN3_EMBEDDING_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def shapes(c, prefix="model."):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d, q, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    yield f"{prefix}embed_tokens.weight", (v, h)
    for layer in range(c["num_hidden_layers"]):
        p = f"{prefix}layers.{layer}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield f"{p}.self_attn.q_proj.weight", (q * d, h)
        yield f"{p}.self_attn.k_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.v_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.o_proj.weight", (h, q * d)
        if c["model_type"] == "qwen3":
            yield f"{p}.self_attn.q_norm.weight", (d,)
            yield f"{p}.self_attn.k_norm.weight", (d,)
        yield f"{p}.post_attention_layernorm.weight", (h,)
        yield f"{p}.mlp.gate_proj.weight", (i, h)
        yield f"{p}.mlp.up_proj.weight", (i, h)
        yield f"{p}.mlp.down_proj.weight", (h, i)
    yield f"{prefix}norm.weight", (h,)
    if not c["tie_word_embeddings"]:
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


def write_sentence_transformers(out, config):
    """The files that make `out` a Qwen3-Embedding-style sentence-transformers model."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    with open(os.path.join(out, "modules.json"), "w") as f:
        json.dump(modules, f, indent=2)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    modes = ["cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens"]
    pooling = {"word_embedding_dimension": config["hidden_size"], **{f"pooling_mode_{m}": False for m in modes},
               "pooling_mode_lasttoken": True, "include_prompt": True}
    with open(os.path.join(out, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f, indent=2)
    with open(os.path.join(out, "config_sentence_transformers.json"), "w") as f:
        json.dump({"prompts": {"query": "Instruct: Given a web search query, retrieve relevant passages that "
                               "answer the query\nQuery:", "document": ""},
                   "default_prompt_name": None, "similarity_fn_name": "cosine"}, f, indent=2)


def write_random_sharded(out, named_shapes, seed):
    """Writes bf16 tensors of the given (name, shape) pairs into `out` as sharded safetensors
    (about 5 GiB a shard, the Hugging Face "-of-" names) with their index: vectors (norms) are
    ones, matrices N(0, 0.02) drawn on the GPU from `seed`."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
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

    for name, shape in named_shapes:
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
    renamed = {k: v.replace(".safetensors", f"-of-{total:05d}.safetensors") for k, v in index.items()}
    for i in range(1, total + 1):
        os.rename(os.path.join(out, f"model-{i:05d}.safetensors"), os.path.join(out, f"model-{i:05d}-of-{total:05d}.safetensors"))
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": renamed}, f)


def main():
    args = sys.argv[1:]
    tokenizer_dir = None
    if args[:1] == ["--qwen3-embedding"]:
        tokenizer_dir, args = args[1], args[2:]
    out = args[0]
    config, prefix = (QWEN3_EMBEDDING_CONFIG, "") if tokenizer_dir else (CONFIG, "model.")
    if os.path.exists(os.path.join(out, "model.safetensors.index.json")):
        print(f"{out} exists; reusing it")
        return
    os.makedirs(out, exist_ok=True)
    started = time.time()
    write_random_sharded(out, shapes(config, prefix), seed=1234)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if tokenizer_dir:
        write_sentence_transformers(out, config)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out, name))
    else:
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": False}, f)
        write_tokenizer(out)
    print(f"wrote {out} in {time.time() - started:.1f}s")


if __name__ == "__main__":
    main()
