#!/usr/bin/env python3
"""Writes a gpt-oss-120b-shaped (or -20b-shaped) model directory with random weights in the
published layout, for benchmarks: MXFP4 experts (`*_blocks` random E2M1 codes, `*_scales` random
E8M0 exponents 2^-9 to 2^-3), everything else bf16 (normal, std 0.02; norm weights 1; biases and
sinks small), the published config's keys (hidden 2880, 64 query and 8 KV heads of 64, 128 or 32
experts of width 2880, top 4, alternating sliding (128) and full layers, YaRN). The full models
have 36 and 24 layers (about 61 GB and 13 GB); LAYERS writes fewer, so the model fits the GPU
machine's disk, and the figures then say so. The tokenizer is synthetic (word level, 201088
words, the end-of-text tokens at the real ids), so every id decodes.
Usage: make_gptoss_shaped.py OUT_DIR [LAYERS] [--shape 120b|20b] [--prompt TOKENS] [--sizes]

It prints the bytes of all the weights, the bytes one decode token reads (the active-weight floor's
numerator) and the FLOPs of one prefill of TOKENS tokens (default 32768) and its floor at 790 TFLOP/s
(the H100's measured bf16 GEMM rate, docs/performance.md): the products of every layer over the
tokens' 4 active experts, attention and the router (2 FLOPs a weight a token), and attention's
score and value products (4 FLOPs a query, key and head dimension: every earlier key in full
layers, the last 128 in sliding ones); the LM head once.
"""
import argparse
import json
import os
import time

import torch
from safetensors.torch import save_file

GEMM_RATE = 790e12

BASE = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "bos_token_id": 199998,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_key_value_heads": 8,
    "output_router_logits": False,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 201088,
}
SHAPES = {"120b": (36, 128), "20b": (24, 32)}


def config_of(shape, layers):
    full_layers, experts = SHAPES[shape]
    c = dict(BASE)
    c["num_hidden_layers"] = layers or full_layers
    c["num_local_experts"] = experts
    c["layer_types"] = [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(c["num_hidden_layers"])
    ]
    return c


def tensors(c, gen):
    """Every tensor of the model, in order, as (name, tensor)."""
    h, v, d = c["hidden_size"], c["vocab_size"], c["head_dim"]
    q, kv = c["num_attention_heads"], c["num_key_value_heads"]
    e, inter = c["num_local_experts"], c["intermediate_size"]

    def normal(*shape, std=0.02):
        return (torch.randn(shape, generator=gen, device="cuda") * std).to(torch.bfloat16).cpu()

    def codes(*shape):
        return torch.randint(0, 256, shape, generator=gen, device="cuda", dtype=torch.uint8).cpu()

    def scales(*shape):
        return torch.randint(118, 125, shape, generator=gen, device="cuda", dtype=torch.uint8).cpu()

    yield "model.embed_tokens.weight", normal(v, h)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        yield f"{p}.input_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)
        yield f"{p}.post_attention_layernorm.weight", torch.ones(h, dtype=torch.bfloat16)
        for name, rows in (("q_proj", q * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            yield f"{p}.self_attn.{name}.weight", normal(rows, h)
            yield f"{p}.self_attn.{name}.bias", normal(rows)
        yield f"{p}.self_attn.o_proj.weight", normal(h, q * d)
        yield f"{p}.self_attn.o_proj.bias", normal(h)
        yield f"{p}.self_attn.sinks", normal(q, std=1.0)
        yield f"{p}.mlp.router.weight", normal(e, h)
        yield f"{p}.mlp.router.bias", normal(e)
        x = f"{p}.mlp.experts"
        yield f"{x}.gate_up_proj_blocks", codes(e, 2 * inter, h // 32, 16)
        yield f"{x}.gate_up_proj_scales", scales(e, 2 * inter, h // 32)
        yield f"{x}.gate_up_proj_bias", normal(e, 2 * inter)
        yield f"{x}.down_proj_blocks", codes(e, h, inter // 32, 16)
        yield f"{x}.down_proj_scales", scales(e, h, inter // 32)
        yield f"{x}.down_proj_bias", normal(e, h)
    yield "model.norm.weight", torch.ones(h, dtype=torch.bfloat16)
    yield "lm_head.weight", normal(v, h)


def prefill_flops(c, tokens):
    """FLOPs of one prefill of `tokens` tokens: (products, attention)."""
    h, d = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"], c["num_key_value_heads"]
    e, inter, top_k = c["num_local_experts"], c["intermediate_size"], c["num_experts_per_tok"]
    per_token = (q + 2 * kv) * d * h + h * q * d + e * h + top_k * 3 * inter * h
    products = 2 * tokens * per_token * c["num_hidden_layers"] + 2 * c["vocab_size"] * h
    window = c["sliding_window"]
    attention = 0
    for kind in c["layer_types"]:
        if kind == "full_attention":
            keys = tokens * (tokens + 1) // 2
        else:
            keys = sum(min(i + 1, window) for i in range(tokens))
        attention += 4 * q * d * keys
    return products, attention


def layer_bytes(c, experts):
    """Bytes of one layer's weights that a step reads with `experts` experts: attention's
    projections and biases, the sinks, the router and its bias, the two norms, and each expert's
    MXFP4 codes (half a byte a weight), E8M0 scales (one byte per 32 weights) and bf16 biases."""
    h, d = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"], c["num_key_value_heads"]
    e, inter = c["num_local_experts"], c["intermediate_size"]
    attention = 2 * ((q + 2 * kv) * d * h + (q + 2 * kv) * d + h * q * d + h + q)
    router = 2 * (e * h + e)
    expert_weights = 2 * inter * h + h * inter
    expert = expert_weights // 2 + expert_weights // 32 + 2 * (2 * inter + h)
    return attention + router + 2 * 2 * h + experts * expert


def active_bytes(c):
    """Bytes one decode token reads (the active-weight floor): every layer with its chosen
    experts, the final norm and the LM head (the embedding row is one row, left out)."""
    h, v = c["hidden_size"], c["vocab_size"]
    return c["num_hidden_layers"] * layer_bytes(c, c["num_experts_per_tok"]) + 2 * h + 2 * v * h


def total_bytes(c):
    """Bytes of every weight (what the GPU holds), as the files store them: every layer with all
    its experts, the final norm, the embedding and the LM head."""
    h, v = c["hidden_size"], c["vocab_size"]
    return c["num_hidden_layers"] * layer_bytes(c, c["num_local_experts"]) + 2 * h + 2 * 2 * v * h


def write_tokenizer(out, c):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    special = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>"}
    vocab = {special.get(i, f"w{i}"): i for i in range(c["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in special.values()])
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|return|>"}, f)


def main():
    parser = argparse.ArgumentParser(description="Writes a gpt-oss-shaped model with random weights.")
    parser.add_argument("out")
    parser.add_argument("layers", nargs="?", type=int)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="120b")
    parser.add_argument("--prompt", type=int, default=32768)
    parser.add_argument(
        "--sizes", action="store_true", help="print the bytes of all the weights and of one layer, write nothing"
    )
    args = parser.parse_args()
    c = config_of(args.shape, args.layers)
    if args.sizes:
        print(f"weights: {total_bytes(c)} bytes in all")
        print(f"layer: {layer_bytes(c, c['num_local_experts'])} bytes")
        return
    products, attention = prefill_flops(c, args.prompt)
    floor = (products + attention) / GEMM_RATE
    print(
        f"prefill of {args.prompt} tokens: {products:.3e} FLOPs of products, {attention:.3e} of attention; "
        f"FLOP floor {floor:.4f} s at {GEMM_RATE / 1e12:.0f} TFLOP/s"
    )
    print(f"weights: {total_bytes(c)} bytes in all")
    print(f"active bytes per decode token: {active_bytes(c)}")
    if os.path.exists(os.path.join(args.out, "model.safetensors.index.json")):
        print(f"{args.out} exists; reusing it")
        return
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    gen = torch.Generator(device="cuda").manual_seed(45)
    shard, shard_bytes, index, names = {}, 0, {}, []

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"part-{len(names) + 1:05d}"
            save_file(shard, os.path.join(args.out, name), metadata={"format": "pt"})
            names.append((name, list(shard)))
            shard, shard_bytes = {}, 0

    for name, t in tensors(c, gen):
        shard[name] = t
        shard_bytes += t.numel() * t.element_size()
        if shard_bytes >= 5 << 30:
            flush()
    flush()
    for i, (name, keys) in enumerate(names):
        final = f"model-{i + 1:05d}-of-{len(names):05d}.safetensors"
        os.rename(os.path.join(args.out, name), os.path.join(args.out, final))
        index.update({k: final for k in keys})
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 199998, "eos_token_id": [200002, 199999], "do_sample": False}, f)
    write_tokenizer(args.out, c)
    print(f"wrote {args.out} ({c['num_hidden_layers']} layers, {args.shape}-shaped) in {time.time() - started:.1f}s")


if __name__ == "__main__":
    main()
