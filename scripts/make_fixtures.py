#!/usr/bin/env python3
"""Builds the tiny model fixtures committed under tests/fixtures/ and their reference outputs.

Three Hugging Face model directories come out of one deterministic run:

- ``inferno-tiny``: a Llama 3 layout (llama3 rope scaling, tied embeddings), trained for a few
  hundred steps on a small corpus about confidential computing so that the embedded default model
  answers in words rather than noise;
- ``tiny-qwen2``: a Qwen2 layout (q/k/v bias, untied embeddings, legacy top-level ``rope_theta``);
- ``tiny-qwen3``: a Qwen3 layout (per-head q/k RMSNorm, explicit ``head_dim`` different from
  hidden/heads), with random weights.

All share a byte-level BPE tokenizer with a 1024-token vocabulary trained here. Each directory gets
a ``golden.json`` with the same keys as ``../shared/fixtures/tiny-llama3/golden.json`` (fp32 forward
over the bf16 weights, on the CPU, eager attention) plus ``teacher_forced``: the top-5 logits and the
top-2 margin at every position of prompt + greedy continuation.

Needs torch, transformers (5.x) and tokenizers; run it on the GPU machine, where they are installed:

    python3 scripts/make_fixtures.py OUTDIR
"""

import json
import os
import random
import sys

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 1024
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

FACTS = [
    ("What is confidential computing?",
     "Confidential computing protects data in use by running code inside a hardware trusted execution environment."),
    ("What is a trusted execution environment?",
     "A trusted execution environment is an isolated part of a processor whose memory is encrypted and whose code is measured."),
    ("What does Inferno do?",
     "Inferno serves language models inside a confidential virtual machine and proves it to clients with attestation."),
    ("What is attestation?",
     "Attestation is signed evidence from the hardware that says which code runs and how it is configured."),
    ("What is SEV-SNP?",
     "SEV-SNP is the AMD technology that encrypts the memory of a virtual machine and signs attestation reports."),
    ("What is TDX?",
     "TDX is the Intel technology for trust domains, isolated virtual machines with signed quotes."),
    ("Why seal the model weights?",
     "Sealed weights are decrypted only after the attestation evidence passes the policy, so the key never leaves the TEE."),
    ("What is the audit log?",
     "The audit log is an append-only Merkle tree of every request, with signed checkpoints that auditors verify offline."),
    ("What is a KV cache?",
     "The KV cache stores the keys and values of earlier tokens so that each new token needs only one step."),
    ("What is continuous batching?",
     "Continuous batching adds and removes requests at every step, so the GPU never waits for the slowest request."),
    ("Who can read my prompt?",
     "Only the attested server can read your prompt; the host and the cloud operator see encrypted memory."),
    ("What is a GPU in confidential mode?",
     "In confidential mode the H100 encrypts every copy between the CPU and the GPU and attests its firmware."),
    ("Hello!", "Hello! I am the Inferno demo model. Ask me about confidential computing."),
    ("Who are you?", "I am a tiny demo model that runs inside Inferno, on the CPU or on a GPU."),
    ("What is a policy?",
     "A policy lists the measurements, versions and settings that evidence must show before secrets are released."),
    ("What is attested TLS?",
     "Attested TLS binds the server's TLS key to its attestation evidence, so the client knows whom it talks to."),
]
PHRASINGS = ["{q}", "Please tell me: {q}", "{q} Answer briefly.", "Question: {q}", "{q_lower}"]
SYSTEMS = [None, "You are a terse assistant.", "You are a helpful assistant.", "Answer in one sentence."]
RAW_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "fn main() { println!(\"hello\"); }",
    "Grüße aus Zürich, 世界 and emoji 🎉 are bytes too.",
    "Measurements, policies and keys: every check must pass before the weights are decrypted.",
]


def corpus_lines():
    import codecs
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        import this  # the Zen of Python adds plain English to the tokenizer corpus
    lines = codecs.decode(this.s, "rot13").splitlines()
    for q, a in FACTS:
        lines += [q, a, q.lower(), a.lower()]
    lines += RAW_TEXT * 4
    lines += [f"Sentence {i} describes an attested server that seals model weights." for i in range(40)]
    return lines


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = LLAMA_SPECIALS + QWEN_SPECIALS
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines() * 8, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def wrap_tokenizer(base, family):
    tok = Tokenizer.from_str(base.to_str())
    if family == "llama":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)],
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            chat_template=LLAMA_TEMPLATE,
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            chat_template=QWEN_TEMPLATE,
        )
    return fast


def chat_examples(rng):
    examples = []
    for q, a in FACTS:
        for phrasing in PHRASINGS:
            for system in SYSTEMS:
                msgs = []
                if system:
                    msgs.append({"role": "system", "content": system})
                user = phrasing.format(q=q, q_lower=q.lower())
                msgs.append({"role": "user", "content": user})
                msgs.append({"role": "assistant", "content": a})
                examples.append(msgs)
    rng.shuffle(examples)
    return examples


def train(model, fast, steps, device):
    rng = random.Random(7)
    examples = chat_examples(rng)
    seqs = [fast.apply_chat_template(m, tokenize=False) for m in examples]
    ids = [fast(s, add_special_tokens=False)["input_ids"] for s in seqs]
    stream = [t for seq in ids for t in seq]
    block = 128
    data = torch.tensor(stream[: len(stream) // block * block]).view(-1, block)
    model.to(device).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(11)
    for step in range(steps):
        idx = torch.randint(0, data.shape[0], (32,), generator=gen)
        batch = data[idx].to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            print(f"  train step {step} loss {loss.item():.3f}", flush=True)
    model.eval()
    return model


def cases(fast):
    long_text = " ".join(
        f"Sentence {i} describes an attested server that seals model weights." for i in range(60)
    )
    chats = [
        [{"role": "user", "content": "What is confidential computing?"}],
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What does Inferno do?"},
        ],
        [{"role": "user", "content": "Summarise: " + long_text}],
    ]
    out = []
    for msgs in chats:
        text = fast.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = fast(text, add_special_tokens=False)["input_ids"]
        out.append({"kind": "chat", "input": msgs, "input_ids": ids})
    for text in ["The quick brown fox", 'fn main() { println!("hello"); }', "Ünïcödé ✓ 中文 🚀 splits bytes"]:
        ids = fast(text)["input_ids"]
        out.append({"kind": "raw", "input": text, "input_ids": ids})
    return out


@torch.no_grad()
def golden(model_dir, cls, fast):
    model = cls.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    result = {
        "model": os.path.basename(model_dir),
        "reference": "transformers fp32 forward over bf16 weights (CPU, eager attention)",
        "cases": [],
    }
    for case in cases(fast):
        ids = case["input_ids"]
        logits = model(torch.tensor([ids])).logits[0]
        last = logits[-1]
        top = torch.topk(last, 20)
        seq = list(ids)
        greedy, margins = [], []
        for _ in range(24):
            step_logits = model(torch.tensor([seq])).logits[0, -1]
            t2 = torch.topk(step_logits, 2)
            greedy.append(int(t2.indices[0]))
            margins.append(float(t2.values[0] - t2.values[1]))
            seq.append(int(t2.indices[0]))
        full = model(torch.tensor([seq])).logits[0]
        t5 = torch.topk(full, 5, dim=-1)
        case.update(
            {
                "last_logits_top20": {"ids": top.indices.tolist(), "values": top.values.tolist()},
                "last_logits_sum": float(last.sum()),
                "last_logits_sumsq": float((last * last).sum()),
                "per_position_argmax": logits.argmax(-1).tolist(),
                "greedy_24": greedy,
                "greedy_margins": margins,
                "greedy_text": fast.decode(greedy),
                "teacher_forced": {
                    "tokens": seq,
                    "top5_ids": t5.indices.tolist(),
                    "top5_values": [[round(v, 6) for v in row] for row in t5.values.tolist()],
                    "margins": (t5.values[:, 0] - t5.values[:, 1]).tolist(),
                },
            }
        )
        result["cases"].append(case)
    with open(os.path.join(model_dir, "golden.json"), "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
    return result


def move_template_into_config(out):
    """transformers 5 writes chat_template.jinja; fold it into tokenizer_config.json."""
    jinja = os.path.join(out, "chat_template.jinja")
    if not os.path.exists(jinja):
        return
    cfg_path = os.path.join(out, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    with open(jinja) as f:
        cfg["chat_template"] = f.read()
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    os.remove(jinja)


def to_legacy_rope(out):
    """Rewrite config.json with top-level rope_theta (the pre-transformers-5 form)."""
    path = os.path.join(out, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    params = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = params.get("rope_theta", 10000.0)
    cfg["rope_scaling"] = None
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    out_root = sys.argv[1]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    base = train_tokenizer()
    llama_tok, qwen_tok = wrap_tokenizer(base, "llama"), wrap_tokenizer(base, "qwen")
    ids = lambda t, s: t.convert_tokens_to_ids(s)

    specs = [
        (
            "inferno-tiny",
            LlamaForCausalLM,
            LlamaConfig(
                vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.05,
                bos_token_id=ids(llama_tok, "<|begin_of_text|>"),
                eos_token_id=[ids(llama_tok, "<|end_of_text|>"), ids(llama_tok, "<|eot_id|>")],
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64},
            ),
            llama_tok,
            600,
        ),
        (
            "tiny-qwen2",
            Qwen2ForCausalLM,
            Qwen2Config(
                vocab_size=VOCAB, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=2048,
                rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.1,
                bos_token_id=None, eos_token_id=ids(qwen_tok, "<|im_end|>"),
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
            qwen_tok,
            0,
        ),
        (
            "tiny-qwen3",
            Qwen3ForCausalLM,
            Qwen3Config(
                vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.1,
                bos_token_id=None, eos_token_id=ids(qwen_tok, "<|im_end|>"),
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            ),
            qwen_tok,
            0,
        ),
    ]
    for name, cls, cfg, fast, steps in specs:
        print(f"== {name}", flush=True)
        torch.manual_seed(1234)
        model = cls(cfg)
        if steps:
            model = train(model, fast, steps, device)
        model = model.to("cpu").to(torch.bfloat16)
        out = os.path.join(out_root, name)
        model.save_pretrained(out, safe_serialization=True)
        model.generation_config.save_pretrained(out)
        fast.save_pretrained(out)
        # The Llama and Qwen2 fixtures keep the template inside tokenizer_config.json (the classic
        # layout); the Qwen3 fixture keeps transformers 5's separate chat_template.jinja.
        if name != "tiny-qwen3":
            move_template_into_config(out)
        if name == "tiny-qwen2":
            to_legacy_rope(out)
        g = golden(out, cls, fast)
        for case in g["cases"]:
            print(f"  {case['kind']:4} {len(case['input_ids']):4} tok  min margin "
                  f"{min(case['greedy_margins']):.4f}  {case['greedy_text'][:70]!r}", flush=True)
        print("  files:", sorted(os.listdir(out)), flush=True)


if __name__ == "__main__":
    main()
