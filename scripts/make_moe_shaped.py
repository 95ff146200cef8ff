#!/usr/bin/env python3
"""Writes a Qwen3-30B-A3B-shaped (or Mixtral-8x7B-shaped) model directory with random bf16 weights,
for benchmarks.

The default config and tensor names are Qwen3-30B-A3B's (hidden 2048, 32 query and 4 KV heads of
128, 128 experts of width 768, top 8 renormalised, vocabulary 151936). `--shape mixtral` writes
Mixtral-8x7B's (hidden 4096, 32 query and 8 KV heads of 128, 8 experts of width 14336, top 2,
vocabulary 32000; `block_sparse_moe.experts.{e}.w1/w3/w2`), which the benchmark serves in FP8
quantized at load (`--quantization fp8`: its bf16 weights do not fit one H100 with a useful cache).
The values are random (normal, std 0.02; norm weights 1), generated on the GPU with a fixed seed.
The full models have 48 and 32 layers (about 61 GB and 93 GB in bf16); LAYERS (the second
argument) writes fewer, so the model fits the GPU machine's disk beside everything else, and the
figures then say so. The tokenizer is synthetic: a word-level vocabulary of the model's size, with
the end-of-text tokens at the real ids, so every id decodes.
Usage: make_moe_shaped.py OUT_DIR [LAYERS] [--shape qwen3|mixtral] [--fp8]

It also prints the bytes a decode step of one token reads (the active-weight floor): attention,
norms, the router, the chosen experts of every layer and the LM head; with `--fp8`, as served
quantized at load (every projection but the router and the LM head in E4M3 with an f32 scale per
row).
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


MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}


def is_mixtral(c):
    return c["model_type"] == "mixtral"


def experts_of(c):
    """The experts per layer, their width and the names of a layer's MoE module and projections
    (gate, up, down)."""
    if is_mixtral(c):
        return c["num_local_experts"], c["intermediate_size"], "block_sparse_moe", ("w1", "w3", "w2")
    return c["num_experts"], c["moe_intermediate_size"], "mlp", ("gate_proj", "up_proj", "down_proj")


def shapes(c):
    h, v = c["hidden_size"], c["vocab_size"]
    d, q, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    experts, inter, module, (gate, up, down) = experts_of(c)
    yield "model.embed_tokens.weight", (v, h)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield f"{p}.self_attn.q_proj.weight", (q * d, h)
        yield f"{p}.self_attn.k_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.v_proj.weight", (kv * d, h)
        yield f"{p}.self_attn.o_proj.weight", (h, q * d)
        if not is_mixtral(c):
            yield f"{p}.self_attn.q_norm.weight", (d,)
            yield f"{p}.self_attn.k_norm.weight", (d,)
        yield f"{p}.post_attention_layernorm.weight", (h,)
        yield f"{p}.{module}.gate.weight", (experts, h)
        for e in range(experts):
            yield f"{p}.{module}.experts.{e}.{gate}.weight", (inter, h)
            yield f"{p}.{module}.experts.{e}.{up}.weight", (inter, h)
            yield f"{p}.{module}.experts.{e}.{down}.weight", (h, inter)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def active_bytes(c, fp8=False):
    """Bytes one decode token reads: every layer's attention, norms and router, its top-k experts,
    the final norm and the LM head (bf16; with `fp8` the projections but the router and the LM
    head in E4M3, one byte a weight and an f32 scale per row, as quantized at load)."""
    h, v = c["hidden_size"], c["vocab_size"]
    d, q, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    experts, inter, _, _ = experts_of(c)
    top_k = c["num_experts_per_tok"]
    weight, scale = (1, 4) if fp8 else (2, 0)
    attention = weight * ((q + 2 * kv) * d * h + h * q * d) + scale * ((q + 2 * kv) * d + h)
    norms = 2 * (2 * h + (0 if is_mixtral(c) else 2 * d))
    routed = 2 * experts * h + top_k * (weight * 3 * inter * h + scale * (2 * inter + h))
    return c["num_hidden_layers"] * (attention + norms + routed) + 2 * (h + v * h)


def write_tokenizer(out, c):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    if is_mixtral(c):
        special = {0: "<unk>", 1: "<s>", 2: "</s>"}
    else:
        special = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}
    vocab = {special.get(i, f"w{i}"): i for i in range(c["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=special.get(0, "w0")))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in special.values()])
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>" if is_mixtral(c) else "<|im_end|>"}, f)


def main():
    import argparse

    parser = argparse.ArgumentParser(description="Writes a MoE-shaped model with random weights.")
    parser.add_argument("out")
    parser.add_argument("layers", nargs="?", type=int)
    parser.add_argument("--shape", choices=("qwen3", "mixtral"), default="qwen3")
    parser.add_argument("--fp8", action="store_true", help="print the floor as served in FP8")
    args = parser.parse_args()
    out = args.out
    config = dict(MIXTRAL if args.shape == "mixtral" else CONFIG)
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    if args.layers:
        config["num_hidden_layers"] = args.layers
    print(f"active bytes per decode token{' (FP8)' if args.fp8 else ''}: {active_bytes(config, args.fp8)}")
    if os.path.exists(os.path.join(out, "model.safetensors.index.json")):
        print(f"{out} exists; reusing it")
        return
    os.makedirs(out, exist_ok=True)
    started = time.time()
    write_random_sharded(out, shapes(config), seed=44)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        bos, eos = config["bos_token_id"], config["eos_token_id"]
        json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, f)
    write_tokenizer(out, config)
    print(f"wrote {out} ({config['num_hidden_layers']} layers) in {time.time() - started:.1f}s")


if __name__ == "__main__":
    main()
