#!/usr/bin/env python3
"""Builds the gpt-oss fixtures under tests/fixtures/ and their reference outputs.

A tiny ``GptOssForCausalLM`` with random weights and the real configuration's keys (``layer_types``
sliding/full alternating, ``sliding_window`` 8 so that prompts run past it, YaRN rope with the
published parameters, biased attention with sinks, 8 experts, top 4, ``swiglu_limit`` 7), saved
twice with the same values:

- ``tiny-gpt-oss``: the experts in MXFP4 (``*_blocks`` / ``*_scales``, ``quant_method`` mxfp4), as
  OpenAI publishes gpt-oss, made by the reference quantizer below;
- ``tiny-gpt-oss-bf16``: the layout transformers saves (``gate_up_proj`` ``[E, hidden, 2I]`` with
  gate and up interleaved, ``down_proj`` ``[E, I, hidden]``), in bf16.

The experts of the bf16 model are the MXFP4 model's dequantized (exact in bf16), so both load to
the same f32 weights and share one reference. Every weight is rounded to bf16 first; the
experts' gate/up weights are drawn wide enough that the SwiGLU clamp engages, and the sinks and
every bias are non-zero.

Each directory gets a ``golden.json`` with the keys of the MoE fixtures' (``make_moe_fixtures.py``:
transformers' fp32 forward over those weights, CPU, eager attention, eager experts), for ten
prompts (five chats, five raw texts), all longer than the window. The tokenizer and chat template are the tiny Qwen3
fixture's (the harmony format is not what these goldens check). Needs torch, transformers (5.x)
and safetensors:

    python3 scripts/make_gptoss_fixture.py               # weights and goldens
    python3 scripts/make_gptoss_fixture.py --goldens-only # goldens of the committed weights
"""

import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM, PreTrainedTokenizerFast

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
TOKENIZER_DIR = os.path.join(ROOT, "tiny-qwen3")
GREEDY_TOKENS = 24
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def quantize_mxfp4(w):
    """The reference MXFP4 quantizer: ``w`` ``[..., n]`` (n a multiple of 32) becomes blocks
    ``[..., n/32, 16]`` (two E2M1 codes a byte, the even element in the low nibble) and E8M0
    scales ``[..., n/32]``. A block's scale is ``2^(floor(log2(amax)) - 2)`` (the OCP rule: the
    largest element lands in [4, 8)), each element the nearest E2M1 value of ``x / scale`` (ties
    to the even code), saturating at 6."""
    *prefix, n = w.shape
    g = w.float().reshape(*prefix, n // 32, 32)
    amax = g.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.zeros_like(amax))
    exp = exp.clamp(-127, 127)
    scaled = g / torch.pow(2.0, exp)[..., None]
    mag = scaled.abs().clamp(max=6.0)
    dist = (mag[..., None] - E2M1).abs()
    # Nearest magnitude; on a tie the even code (argmin takes the first, so prefer even by a nudge).
    nudge = torch.tensor([0.0 if i % 2 == 0 else 1e-7 for i in range(8)])
    code = (dist + nudge).argmin(-1)
    code = code + 8 * ((scaled < 0) & (code > 0)).long()
    code = code.to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (exp + 127).to(torch.uint8)
    return packed.contiguous(), scales.contiguous()


def dequantize_mxfp4(blocks, scales):
    """What the loader computes: codes to E2M1 values, times ``2^(scale - 127)``."""
    lut = torch.cat([E2M1, -E2M1])
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.pow(2.0, scales.float() - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def cases(fast):
    chats = [
        [{"role": "user", "content": "What is confidential computing?"}],
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What does Inferno do with sealed weights?"},
        ],
        [{"role": "user", "content": "Why does a sliding window make long prompts cheap?"}],
        [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "Who checks the attestation report before a prompt is sent?"},
            {"role": "assistant", "content": "The client does."},
            {"role": "user", "content": "And what does it compare the measurements with?"},
        ],
        [{"role": "user", "content": "List three things an audit log must never hold."}],
    ]
    out = []
    for msgs in chats:
        text = fast.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = fast(text, add_special_tokens=False)["input_ids"]
        out.append({"kind": "chat", "input": msgs, "input_ids": ids})
    for text in [
        "The quick brown fox jumps over the lazy dog",
        'fn main() { println!("hello, attested world"); }',
        "Mixture of experts with attention sinks and alternating windows",
        "A sink is a learned logit that joins the softmax's denominator of every head, so",
        "1, 1, 2, 3, 5, 8, 13, 21, 34,",
    ]:
        ids = fast(text)["input_ids"]
        out.append({"kind": "raw", "input": text, "input_ids": ids})
    return out


@torch.no_grad()
def golden(model, fast, name):
    result = {
        "model": name,
        "reference": "transformers fp32 forward over the bf16 weights with MXFP4-dequantized "
        "experts (CPU, eager attention, eager experts)",
        "cases": [],
    }
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
        case.update(
            {
                "last_logits_top20": {"ids": top.indices.tolist(), "values": top.values.tolist()},
                "per_position_argmax": logits.argmax(-1).tolist(),
                "greedy_24": greedy,
                "greedy_margins": margins,
                "greedy_text": fast.decode(greedy),
                "greedy_text_skip_special": fast.decode(greedy, skip_special_tokens=True),
                "teacher_forced": {
                    "tokens": seq,
                    "top5_ids": t5.indices.tolist(),
                    "top5_values": [[round(v, 6) for v in row] for row in t5.values.tolist()],
                },
            }
        )
        result["cases"].append(case)
    return result


def clamp_engagement(model, ids):
    """How many gate (above) and up (either side) values the SwiGLU clamp changes."""
    counts = [0, 0]
    limit = model.config.swiglu_limit

    def hook(module, args, _output):
        x = args[0]
        gu = x @ module.gate_up_proj[0] + module.gate_up_proj_bias[0]
        counts[0] += int((gu[..., ::2] > limit).sum())
        counts[1] += int((gu[..., 1::2].abs() > limit).sum())

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if type(m).__name__ == "GptOssExperts"]
    model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return counts


def main():
    fast = PreTrainedTokenizerFast.from_pretrained(TOKENIZER_DIR)
    if "--goldens-only" in sys.argv[1:]:
        # The committed weights kept as they are; only the reference outputs are written again.
        write_goldens(fast, os.path.join(ROOT, "tiny-gpt-oss-bf16"), os.path.join(ROOT, "tiny-gpt-oss"))
        return
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    cfg = GptOssConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=4, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=0.1, attention_bias=True, swiglu_limit=7.0, bos_token_id=None,
        eos_token_id=eos, pad_token_id=None,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096,
        },
    )
    torch.manual_seed(4545)
    model = GptOssForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            elif name.endswith("experts.gate_up_proj"):
                p.normal_(0.0, 0.5)
            elif name.endswith("_bias") or name.endswith(".bias"):
                p.normal_(0.0, 0.1)
        model = model.to(torch.bfloat16)
        quantized = {}
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                # transformers holds [E, in, out]; MXFP4 is stored [E, out, in/32, 16].
                blocks, scales = quantize_mxfp4(p.float().transpose(1, 2))
                quantized[name] = (blocks, scales)
                p.copy_(dequantize_mxfp4(blocks, scales).transpose(1, 2).to(torch.bfloat16))
    model.generation_config.eos_token_id = eos

    bf16_dir = os.path.join(ROOT, "tiny-gpt-oss-bf16")
    mxfp4_dir = os.path.join(ROOT, "tiny-gpt-oss")
    for d in (bf16_dir, mxfp4_dir):
        shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(bf16_dir, safe_serialization=True)
    model.generation_config.save_pretrained(bf16_dir)
    fast.save_pretrained(bf16_dir)

    # The MXFP4 directory: the same files, the experts' weights as blocks and scales.
    shutil.copytree(bf16_dir, mxfp4_dir)
    os.remove(os.path.join(mxfp4_dir, "model.safetensors"))
    tensors = {}
    for name, p in model.state_dict().items():
        if name in quantized:
            blocks, scales = quantized[name]
            tensors[name + "_blocks"] = blocks
            tensors[name + "_scales"] = scales
        else:
            tensors[name] = p.contiguous()
    save_file(tensors, os.path.join(mxfp4_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(mxfp4_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head",
        ],
    }
    with open(os.path.join(mxfp4_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)

    write_goldens(fast, bf16_dir, mxfp4_dir)


def write_goldens(fast, bf16_dir, mxfp4_dir):
    """Each directory's ``golden.json``, from transformers' fp32 forward over the bf16 copy."""
    reference = GptOssForCausalLM.from_pretrained(
        bf16_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    for d in (bf16_dir, mxfp4_dir):
        g = golden(reference, fast, os.path.basename(d))
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(g, f, indent=1, ensure_ascii=False)
        for file in os.listdir(d):
            os.chmod(os.path.join(d, file), 0o644)
    print("clamp engagement (gate, up) on case 0:",
          clamp_engagement(reference, g["cases"][0]["teacher_forced"]["tokens"]))
    for case in g["cases"]:
        print(f"  {case['kind']:4} {len(case['input_ids']):4} tok  min margin "
              f"{min(case['greedy_margins']):.4f}  {case['greedy_text'][:60]!r}")
    print("files:", sorted(os.listdir(mxfp4_dir)))


if __name__ == "__main__":
    main()
