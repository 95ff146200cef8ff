#!/usr/bin/env python3
"""PyTorch's teacher-forced logits of SmolLM2-135M-Instruct in bf16 and quantized to FP8 at load,
over the first tokens of tests/fixtures/text/perplexity-en.txt: the reference that
tests/smollm2_fp8.rs holds the CPU backend's FP8 against on a real trained model (issue 43,
"Correctness" and "A real model").

The forward pass is scripts/fp8_reference.py's (float64), with the quantization the loader's
``--quantization fp8`` applies: per-channel E4M3 weights, inputs quantized per token from the
row's largest magnitude, LM head kept bf16. Variants, each with the activations kept in f32 as
the CPU backend keeps them unless named otherwise:

- ``bf16``: no quantization;
- ``fp8-weights``: the weights in FP8, the inputs left unquantized;
- ``fp8``: weights and inputs in FP8 (what ``--quantization fp8`` serves);
- ``fp8-bf16-activations``: ``fp8`` with the activations rounded to bf16 where the CUDA backend
  keeps bf16 values. Both are correct computations of the same scheme; how far apart they land
  shows how sensitive the scheme is on this model.

Writes JSON: the token ids, and per variant the perplexity over them and each position's 20
largest logits (ids and values). The full rows would be 50 MB a variant; the test compares the
backend's logits at those ids, which hold every top-1 and near-tie.

    python3 scripts/smollm2_fp8_reference.py SMOLLM2_DIR OUT.json [TOKENS]

Needs torch and tokenizers. SMOLLM2_DIR is what scripts/convert_smollm2.py writes.
"""

import json
import math
import os
import sys

import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_reference  # noqa: E402

TOP = 20
TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "text",
                    "perplexity-en.txt")


def perplexity(logits, ids):
    """exp(mean negative log-likelihood) of each token given the ones before it."""
    log_probs = torch.log_softmax(logits[:-1].double(), dim=-1)
    nll = -log_probs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return math.exp(nll.mean().item())


def main():
    directory, out = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    with open(TEXT) as f:
        ids = tokenizer.encode(f.read(), add_special_tokens=False).ids[:count]
    result = {"model": "SmolLM2-135M-Instruct", "tokens": ids, "variants": {}}
    for variant, at_load, quantize_inputs, round_activations in [
        ("bf16", False, False, False),
        ("fp8-weights", True, False, False),
        ("fp8", True, True, False),
        ("fp8-bf16-activations", True, True, True),
    ]:
        model = fp8_reference.Model(directory, at_load)
        model.round_activations = round_activations
        if not quantize_inputs:
            model.act = {"kind": "none"}
        logits = model.forward(ids, "fp8" if at_load else "bf16").cpu()
        top = torch.topk(logits, TOP, dim=-1)
        result["variants"][variant] = {
            "perplexity": perplexity(logits, ids),
            "top_ids": top.indices.tolist(),
            "top_values": [[round(v, 4) for v in row] for row in top.values.tolist()],
        }
        print(f"RESULT torch SmolLM2 {variant}: perplexity {result['variants'][variant]['perplexity']:.4f}")
    with open(out, "w") as f:
        json.dump(result, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
