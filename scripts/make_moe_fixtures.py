#!/usr/bin/env python3
"""Builds the mixture-of-experts fixtures under tests/fixtures/ and their reference outputs.

Two Hugging Face model directories with random weights and the real configuration keys of their
families, saved by transformers (per-expert tensor names, as published checkpoints have them):

- ``tiny-qwen3-moe``: ``Qwen3MoeForCausalLM``, 8 experts, top 2, ``norm_topk_prob``, per-head
  q/k norm, ``mlp_only_layers`` [1] (layer 1 keeps a dense MLP);
- ``tiny-mixtral``: ``MixtralForCausalLM``, 8 experts, top 2, ``sliding_window`` 24 (shorter than
  the long case's prompt);
- ``tiny-qwen2-moe``: ``Qwen2MoeForCausalLM``, 8 experts, top 2, no renormalisation, a shared
  expert of width 48 with its sigmoid gate, q/k/v biases.

In every sparse layer the router rows of experts 2 and 5 are equal, so those experts tie for every
token; where they tie at the boundary of the top 2, which one transformers chooses is
``torch.topk``'s choice, and ``golden.json`` counts those tokens (``router_boundary_ties``).

Each directory gets a ``golden.json`` with the keys of the dense fixtures' (``make_fixtures.py``:
fp32 forward over the bf16 weights, CPU, eager attention and eager experts) for ten prompts, seven
chats and three raw texts, plus ``greedy_text_skip_special``: the greedy continuation decoded as the
server streams it (special tokens skipped).

``tests/fixtures/moe/topk_ties.json`` holds ``torch.topk``'s indices for inputs full of ties, for
expert counts and k on both of the CPU kernel's paths (``k * 64 <= n`` or not).

The tokenizer is the dense fixtures' (read from ``tests/fixtures/tiny-qwen3``). Needs torch,
transformers (5.x) and safetensors:

    python3 scripts/make_moe_fixtures.py [FIXTURE...]

(with fixture names, only those are rebuilt, and topk_ties.json is left as it is).
"""

import json
import os
import random
import shutil
import sys

import torch
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
TOKENIZER_DIR = os.path.join(ROOT, "tiny-qwen3")
TIED_EXPERTS = (2, 5)
GREEDY_TOKENS = 24


def cases(fast):
    long_text = " ".join(
        f"Sentence {i} describes an attested server that seals model weights." for i in range(12)
    )
    chats = [
        [{"role": "user", "content": "What is confidential computing?"}],
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What does Inferno do?"},
        ],
        [{"role": "user", "content": "Summarise: " + long_text}],
        [{"role": "user", "content": "Hello!"}],
        [{"role": "user", "content": "Why seal the model weights?"}],
        [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "What is attestation?"},
        ],
        [{"role": "user", "content": "What is a KV cache? Answer briefly."}],
    ]
    out = []
    for msgs in chats:
        text = fast.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = fast(text, add_special_tokens=False)["input_ids"]
        out.append({"kind": "chat", "input": msgs, "input_ids": ids})
    for text in ["The quick brown fox", 'fn main() { println!("hello"); }', "Mixture of experts"]:
        ids = fast(text)["input_ids"]
        out.append({"kind": "raw", "input": text, "input_ids": ids})
    return out


def tie_router_rows(model, num_experts):
    """Makes the router rows of the tied experts equal in every sparse layer."""
    a, b = TIED_EXPERTS
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("gate.weight") and param.dim() == 2 and param.shape[0] == num_experts:
                param[b].copy_(param[a])


def count_boundary_ties(model, top_k, ids):
    """Tokens of the forward pass of `ids` whose k-th and (k+1)-th router probabilities are
    equal (so torch.topk's tie order decides an expert)."""
    ties = [0]

    def hook(_module, _inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        probs = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(probs, top_k + 1, dim=-1).values
        ties[0] += int((top[:, top_k - 1] == top[:, top_k]).sum())

    handles = [
        m.register_forward_hook(hook)
        for name, m in model.named_modules()
        if type(m).__name__.endswith("TopKRouter")
    ]
    model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return ties[0]


@torch.no_grad()
def golden(model_dir, cls, fast, top_k):
    model = cls.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    result = {
        "model": os.path.basename(model_dir),
        "reference": "transformers fp32 forward over bf16 weights (CPU, eager attention, eager experts)",
        "cases": [],
    }
    ties = 0
    for case in cases(fast):
        ids = case["input_ids"]
        logits = model(torch.tensor([ids])).logits[0]
        last = logits[-1]
        top = torch.topk(last, 20)
        seq = list(ids)
        greedy, margins = [], []
        for _ in range(GREEDY_TOKENS):
            step_logits = model(torch.tensor([seq])).logits[0, -1]
            t2 = torch.topk(step_logits, 2)
            greedy.append(int(t2.indices[0]))
            margins.append(float(t2.values[0] - t2.values[1]))
            seq.append(int(t2.indices[0]))
        full = model(torch.tensor([seq])).logits[0]
        t5 = torch.topk(full, 5, dim=-1)
        ties += count_boundary_ties(model, top_k, seq)
        case.update(
            {
                "last_logits_top20": {"ids": top.indices.tolist(), "values": top.values.tolist()},
                "last_logits_sum": float(last.sum()),
                "last_logits_sumsq": float((last * last).sum()),
                "per_position_argmax": logits.argmax(-1).tolist(),
                "greedy_24": greedy,
                "greedy_margins": margins,
                "greedy_text": fast.decode(greedy),
                "greedy_text_skip_special": fast.decode(greedy, skip_special_tokens=True),
                "teacher_forced": {
                    "tokens": seq,
                    "top5_ids": t5.indices.tolist(),
                    "top5_values": [[round(v, 6) for v in row] for row in t5.values.tolist()],
                    "margins": (t5.values[:, 0] - t5.values[:, 1]).tolist(),
                },
            }
        )
        result["cases"].append(case)
    result["router_boundary_ties"] = ties
    with open(os.path.join(model_dir, "golden.json"), "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
    return result


def topk_ties():
    """torch.topk's indices for values drawn from a few levels (many ties), per (n, k)."""
    rng = random.Random(44)
    shapes = [(3, 2), (4, 2), (8, 1), (8, 2), (8, 8), (10, 3), (16, 4), (60, 4), (64, 8),
              (128, 8), (128, 1), (256, 4), (512, 8)]
    out = []
    for n, k in shapes:
        for _ in range(8 if n >= 256 else 24):
            levels = [0.125 * rng.randint(1, 6) for _ in range(rng.randint(2, 5))]
            values = [rng.choice(levels) for _ in range(n)]
            t = torch.tensor(values, dtype=torch.float32)
            out.append({"values": values, "k": k, "indices": torch.topk(t, k).indices.tolist()})
    os.makedirs(os.path.join(ROOT, "moe"), exist_ok=True)
    with open(os.path.join(ROOT, "moe", "topk_ties.json"), "w") as f:
        json.dump({"reference": f"torch {torch.__version__} topk (CPU)", "cases": out}, f)


def main():
    fast = PreTrainedTokenizerFast.from_pretrained(TOKENIZER_DIR)
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    specs = [
        (
            "tiny-qwen3-moe",
            Qwen3MoeForCausalLM,
            Qwen3MoeConfig(
                vocab_size=1024, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[1], max_position_embeddings=2048, rms_norm_eps=1e-6,
                tie_word_embeddings=False, initializer_range=0.1, bos_token_id=None,
                eos_token_id=eos, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
        ),
        (
            "tiny-mixtral",
            MixtralForCausalLM,
            MixtralConfig(
                vocab_size=1024, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                num_experts_per_tok=2, sliding_window=24, max_position_embeddings=2048,
                rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.1,
                bos_token_id=None, eos_token_id=eos,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
        ),
        (
            "tiny-qwen2-moe",
            Qwen2MoeForCausalLM,
            Qwen2MoeConfig(
                vocab_size=1024, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                shared_expert_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
                initializer_range=0.1, bos_token_id=None, eos_token_id=eos,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
        ),
    ]
    only = sys.argv[1:]
    for name, cls, cfg in specs:
        if only and name not in only:
            continue
        print(f"== {name}", flush=True)
        torch.manual_seed(4444)
        model = cls(cfg)
        tie_router_rows(model, 8)
        model = model.to(torch.bfloat16)
        out = os.path.join(ROOT, name)
        shutil.rmtree(out, ignore_errors=True)
        model.save_pretrained(out, safe_serialization=True)
        model.generation_config.save_pretrained(out)
        fast.save_pretrained(out)
        for file in os.listdir(out):
            os.chmod(os.path.join(out, file), 0o644)
        g = golden(out, cls, fast, cfg.num_experts_per_tok)
        print(f"  router boundary ties: {g['router_boundary_ties']}", flush=True)
        for case in g["cases"]:
            print(f"  {case['kind']:4} {len(case['input_ids']):4} tok  min margin "
                  f"{min(case['greedy_margins']):.4f}  {case['greedy_text'][:60]!r}", flush=True)
        print("  files:", sorted(os.listdir(out)), flush=True)
    if not only:
        topk_ties()


if __name__ == "__main__":
    main()
