#!/usr/bin/env python3
"""Builds the FP8 model fixtures under tests/fixtures/fp8/ from tests/fixtures/inferno-tiny.

One directory per published FP8 form, each with that publisher's ``quantization_config`` shape
and tensor names, quantized here from inferno-tiny's bf16 weights (a trained Llama layout):

- ``compressed-tensors-dynamic``: RedHatAI's ``*-FP8-dynamic``: per-channel ``weight_scale``
  [out, 1], dynamic per-token activations, ``lm_head`` ignored;
- ``compressed-tensors-static``: RedHatAI's ``*-FP8``: per-tensor ``weight_scale`` [1] and static
  ``input_scale`` [1] (a calibration needs a forward pass; this writes a fixed 8.0 / 448, which
  maps inputs up to 8.0 in magnitude onto E4M3's range);
- ``fbgemm``: Meta's ``fbgemm_fp8``: per-channel ``weight_scale`` [out, 1], dynamic per-token
  activations capped at ``activation_scale_ub``;
- ``block``: Qwen3's and DeepSeek's ``fp8`` with ``weight_block_size`` [128, 128]:
  ``weight_scale_inv`` [ceil(out/128), ceil(in/128)] (the scale the values are multiplied by,
  despite its name, as those checkpoints store it).

Two more directories hold mixtures of experts in the forms their families publish, quantized from
the MoE fixtures (``scripts/make_moe_fixtures.py``); every expert's projections are FP8 with
scales of their own, the router stays bf16:

- ``moe-qwen3-block``: Qwen3-30B-A3B-FP8's ``fp8`` with ``weight_block_size`` [128, 128] and
  ``modules_to_not_convert`` naming the LM head and the routers, from ``tiny-qwen3-moe``;
- ``moe-mixtral-static``: RedHatAI's Mixtral ``*-FP8``: compressed-tensors per-tensor weight and
  static input scales per expert, the router ignored (``re:.*block_sparse_moe[.]gate$``), from
  ``tiny-mixtral``.

Each directory gets ``expected.json``: for every quantized projection of layer 0, the sum of its
dequantized weights and its first 8 values, computed here with numpy so that the loader is
checked against an implementation of its own.

Needs numpy only (and scripts/safetensors_io.py):

    python3 scripts/make_fp8_fixtures.py
"""

import json
import os
import re
import shutil

import numpy as np

import safetensors_io

ROOT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
SOURCE = os.path.join(ROOT, "inferno-tiny")
OUT = os.path.join(ROOT, "fp8")
E4M3_MAX = 448.0
PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def e4m3_table():
    """The value of every E4M3 code (NaN for the two NaN codes)."""
    values = np.zeros(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent, mantissa = (code >> 3) & 0x0F, code & 0x07
        if exponent == 0x0F and mantissa == 0x07:
            values[code] = np.nan
        elif exponent == 0:
            values[code] = sign * mantissa / 8.0 * 2.0 ** -6
        else:
            values[code] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return values


TABLE = e4m3_table()
POSITIVE = TABLE[:127]  # codes 0..126, increasing


def to_e4m3(x):
    """Nearest E4M3 code (ties to the even code), saturating at +-448."""
    x = np.asarray(x, dtype=np.float64)
    magnitude = np.minimum(np.abs(x), E4M3_MAX)
    upper = np.clip(np.searchsorted(POSITIVE, magnitude, side="left"), 1, 126)
    below, above = POSITIVE[upper - 1], POSITIVE[upper]
    to_below, to_above = magnitude - below, above - magnitude
    pick_below = (to_below < to_above) | ((to_below == to_above) & ((upper - 1) % 2 == 0))
    code = np.where(pick_below, upper - 1, upper)
    code = np.where(magnitude <= 0, 0, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def quantize(weight, layout):
    """E4M3 codes, f32 scales and the dequantized matrix of an [out, in] matrix, with scales per
    'tensor', per 'channel' or per (rows, cols) block: each the largest magnitude it covers over
    448, at least 1 / (448 * 512)."""
    out, inp = weight.shape
    if layout == "tensor":
        scales = np.array([np.abs(weight).max()])
        expanded = np.full(weight.shape, 1.0)
    elif layout == "channel":
        scales = np.abs(weight).max(axis=1, keepdims=True)
    else:
        rows, cols = layout
        grid = (-(-out // rows), -(-inp // cols))
        scales = np.zeros(grid)
        for i in range(grid[0]):
            for j in range(grid[1]):
                scales[i, j] = np.abs(weight[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]).max()
    scales = np.maximum(scales / E4M3_MAX, 1.0 / (E4M3_MAX * 512.0)).astype(np.float32)
    if layout == "tensor":
        expanded = np.full(weight.shape, scales[0])
    elif layout == "channel":
        expanded = np.broadcast_to(scales, weight.shape)
    else:
        expanded = np.repeat(np.repeat(scales, rows, axis=0), cols, axis=1)[:out, :inp]
    codes = to_e4m3(weight / expanded)
    return codes, scales, TABLE[codes] * expanded


def compressed_tensors(weight_strategy, input_activations):
    """A compressed-tensors float-quantized config as llm-compressor writes it."""
    weights = {"num_bits": 8, "type": "float", "strategy": weight_strategy, "symmetric": True,
               "dynamic": False, "observer": "minmax"}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                      "input_activations": input_activations,
                                      "output_activations": None}},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


FORMATS = {
    "compressed-tensors-dynamic": {
        "layout": "channel",
        "scale_name": "weight_scale",
        "input_scale": False,
        "config": compressed_tensors("channel", {
            "num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True,
            "observer": None}),
    },
    "compressed-tensors-static": {
        "layout": "tensor",
        "scale_name": "weight_scale",
        "input_scale": True,
        "config": compressed_tensors("tensor", {
            "num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False,
            "observer": "minmax"}),
    },
    "fbgemm": {
        "layout": "channel",
        "scale_name": "weight_scale",
        "input_scale": False,
        "config": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                   "modules_to_not_convert": ["lm_head"]},
    },
    "block": {
        "layout": (128, 128),
        "scale_name": "weight_scale_inv",
        "input_scale": False,
        "config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                   "weight_block_size": [128, 128]},
    },
}

# The static input scale written for every projection: inputs up to 8.0 in magnitude map to 448.
STATIC_INPUT_SCALE = 8.0 / E4M3_MAX


# The MoE forms: (directory, source fixture, form); their configs add the publisher's ignore list
# (Qwen's names the LM head and each sparse layer's router: tiny-qwen3-moe's layers 0 and 2).
MOE_FORMS = [
    ("moe-qwen3-block", "tiny-qwen3-moe", dict(
        FORMATS["block"],
        config=dict(FORMATS["block"]["config"], modules_to_not_convert=[
            "lm_head", "model.layers.0.mlp.gate", "model.layers.2.mlp.gate"]))),
    ("moe-mixtral-static", "tiny-mixtral", dict(
        FORMATS["compressed-tensors-static"],
        config=dict(FORMATS["compressed-tensors-static"]["config"],
                    ignore=["lm_head", "re:.*block_sparse_moe[.]gate$"]))),
]
EXPERT_PROJECTION = re.compile(r"experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)$")


def is_projection(module):
    """Whether `module` is a quantized projection: attention, a dense MLP's or an expert's."""
    return any(module.endswith(p) for p in PROJECTIONS) or EXPERT_PROJECTION.search(module)


def main():
    forms = [(name, SOURCE, form) for name, form in FORMATS.items()]
    forms += [(name, os.path.join(ROOT, source), form) for name, source, form in MOE_FORMS]
    for name, source, form in forms:
        write_form(name, source, form)


def write_form(name, source, form):
    """Quantizes the fixture `source` into the FP8 form `form`, in tests/fixtures/fp8/`name`."""
    weights = safetensors_io.read_bf16(os.path.join(source, "model.safetensors"))
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    tensors, expected = {}, {}
    for tensor, values in weights.items():
        module = tensor.rsplit(".", 1)[0]
        if tensor.endswith(".weight") and is_projection(module):
            codes, scales, dequantized = quantize(values, form["layout"])
            tensors[tensor] = ("F8_E4M3", values.shape, codes.tobytes())
            tensors[f"{module}.{form['scale_name']}"] = ("F32", scales.shape, scales.astype("<f4").tobytes())
            if form["input_scale"]:
                tensors[f"{module}.input_scale"] = ("F32", (1,), np.array([STATIC_INPUT_SCALE], dtype="<f4").tobytes())
            if module.startswith("model.layers.0."):
                expected[tensor] = {
                    "sum": float(dequantized.sum()),
                    "first": [float(v) for v in dequantized.reshape(-1)[:8]],
                }
        else:
            tensors[tensor] = ("BF16", values.shape, safetensors_io.bf16_bytes(values))
    safetensors_io.write(os.path.join(out, "model.safetensors"), tensors)
    quantized = dict(config, quantization_config=form["config"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(quantized, f, indent=2)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(os.path.join(source, file), os.path.join(out, file))
    print(name, len(tensors), "tensors")


if __name__ == "__main__":
    main()
