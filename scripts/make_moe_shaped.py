#!/usr/bin/env python3
"""Writes a Qwen3-30B-A3B-shaped model directory with random bf16 weights, for benchmarks.

The config and tensor names are Qwen3-30B-A3B's (hidden 2048, 32 query and 4 KV heads of 128,
128 experts of width 768, top 8 renormalised, vocabulary 151936); the values are random (normal,
std 0.02; norm weights 1), generated on the GPU with a fixed seed. The full model has 48 layers
(about 61 GB); LAYERS (the second argument) writes fewer, so it fits the GPU machine's disk beside
everything else, and the figures then say so. The tokenizer is synthetic: a word-level vocabulary
of 151936 words, the end of text and <|im_end|> at Qwen's ids, so every id decodes.
Usage: make_moe_shaped.py OUT_DIR [LAYERS]

It also prints the bytes a decode step of one token reads (the active-weight floor): attention,
norms, the router, the 8 chosen experts of every layer and the LM head.
"""
import json
import os
import sys
import time

from make_llama8b import write_random_sharded

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 151936,
}


def shapes(c):
    h, v = c["hidden_size"], c["vocab_size"]
    d, q, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    experts, inter = c["num_experts"], c["moe_intermediate_size"]
    yield "model.embed_tokens.weight", (v, h)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield f"{p}.self_attn.q_proj.weight", (q * d, h)
        yield f"{p}.self_attn.k_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.v_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.o_proj.weight", (h, q * d)
        yield f"{p}.self_attn.q_norm.weight", (d,)
        yield f"{p}.self_attn.k_norm.weight", (d,)
        yield f"{p}.post_attention_layernorm.weight", (h,)
        yield f"{p}.mlp.gate.weight", (experts, h)
        for e in range(experts):
            yield f"{p}.mlp.experts.{e}.gate_proj.weight", (inter, h)
            yield f"{p}.mlp.experts.{e}.up_proj.weight", (inter, h)
            yield f"{p}.mlp.experts.{e}.down_proj.weight", (h, inter)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def active_bytes(c):
    """Bytes one decode token reads: every layer's attention, norms and router, its top-k experts,
    the final norm and the LM head (bf16)."""
    h, v = c["hidden_size"], c["vocab_size"]
    d, q, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    attention = (q + 2 * kv) * d * h + h * q * d + 2 * d + 2 * h
    routed = c["num_experts"] * h + c["num_experts_per_tok"] * 3 * c["moe_intermediate_size"] * h
    return 2 * (c["num_hidden_layers"] * (attention + routed) + h + v * h)


def write_tokenizer(out, c):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    special = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}
    vocab = {special.get(i, f"w{i}"): i for i in range(c["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in special.values()])
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>"}, f)


def main():
    out = sys.argv[1]
    config = dict(CONFIG)
    if len(sys.argv) > 2:
        config["num_hidden_layers"] = int(sys.argv[2])
    print(f"active bytes per decode token: {active_bytes(config)}")
    if os.path.exists(os.path.join(out, "model.safetensors.index.json")):
        print(f"{out} exists; reusing it")
        return
    os.makedirs(out, exist_ok=True)
    started = time.time()
    write_random_sharded(out, shapes(config), seed=44)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": 151645, "do_sample": False}, f)
    write_tokenizer(out, config)
    print(f"wrote {out} ({config['num_hidden_layers']} layers) in {time.time() - started:.1f}s")


if __name__ == "__main__":
    main()
