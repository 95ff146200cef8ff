#!/usr/bin/env python3
"""Teacher-forced logits of the tiny FP8 models in PyTorch, the reference tests/cuda_fp8.rs
compares the CUDA backend with (issue 43, "Correctness"; stage ``fp8`` of scripts/gpu-check.sh).

For each model: the FP8 fixtures in tests/fixtures/fp8/ as published (compressed-tensors dynamic
and static, fbgemm, block scales) and the bf16 fixtures quantized as the loader's
``--quantization fp8`` does (per-channel weight scales, dynamic per-token input scales, LM head
kept bf16). The forward pass is written out here from the architectures' definitions (Llama,
Qwen2's q/k/v bias, Qwen3's q/k norm, llama3 rope scaling), in float64 on the GPU, rounding to
bf16 where the engine keeps bf16 values (the norms' outputs, q/k/v after the rotary embedding,
the attention output, SwiGLU's output; the residual stream stays wide), with:

- weights dequantized exactly: E4M3 code times its scale (per tensor, per channel or per
  [128, 128] block);
- every FP8 product's input quantized as the format says: divided by its scale in f32 (dynamic
  per token from the row's largest magnitude / 448, at least 1 / (448 * 512), capped at fbgemm's
  ``activation_scale_ub``; per token and 128-column group for block scales; the projection's
  ``input_scale`` for static), rounded to E4M3 (nearest, ties to even, saturating at 448) and
  multiplied back.

Variants per model (``variant`` in the index): ``fp8`` as above; ``fp8-bf16-inputs`` with each
dequantized input also rounded to bf16 (what the CUDA kernels multiply); ``fp8-weights`` the FP8
weights with the inputs left unquantized (weight-only FP8), and ``fp8-weights-f32`` the same
with every activation kept in f32 (the CPU backend's precision, where the others round to bf16
where the CUDA backend does); ``bf16`` the unquantized model (bf16
fixtures only), for the bf16 path's own distance to this reference.

Writes OUT/<name>.<variant>.f32 (positions x vocab, f32 little-endian) and OUT/index.json.
The token sequence is tests/cuda_fp8.rs's (the same generator; the index carries it).

    python3 scripts/fp8_reference.py FIXTURES_DIR OUT_DIR [POSITIONS]
"""

import json
import math
import os
import struct
import sys

import torch

E4M3_MAX = 448.0
MIN_SCALE = 1.0 / (448.0 * 512.0)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F8_E4M3": torch.float8_e4m3fn,
}


def read_safetensors(path):
    """Every tensor of a .safetensors file, as float64 on the device (E4M3 codes widened)."""
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    base = 8 + size
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        raw = bytearray(data[base + start : base + end])
        t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(info["shape"])
        out[name] = t.to(torch.float32).to(DEVICE).to(torch.float64)
    return out


def bf16(t):
    """t rounded to bf16 (kept float64)."""
    return t.to(torch.bfloat16).to(torch.float64)


def e4m3(t):
    """t (float32) rounded to E4M3, saturating at 448, as float64."""
    return t.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32).to(torch.float64)


def tokens(vocab, n):
    """tests/cuda_fp8.rs's token sequence."""
    state = 0x2545F491
    out = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((state >> 33) % vocab)
    return out


class Fp8Linear:
    """An FP8 projection: codes [n, k], scales [n, groups] of `group` columns, and how its input
    is quantized."""

    def __init__(self, codes, scales, group, act):
        self.codes, self.scales, self.group, self.act = codes, scales, group, act

    def quantize_input(self, x, round_bf16):
        kind = self.act["kind"]
        xf = x.to(torch.float32)
        t, k = xf.shape
        if kind == "static":
            scale = torch.full((t, 1), self.act["scale"], dtype=torch.float32, device=x.device)
            q = e4m3(xf / scale) * scale.to(torch.float64)
        else:
            g = self.act.get("group") or k
            groups = (k + g - 1) // g
            pad = groups * g - k
            xp = torch.nn.functional.pad(xf, (0, pad)).reshape(t, groups, g)
            amax = xp.abs().amax(dim=2, keepdim=True)
            if self.act.get("ub"):
                amax = amax.clamp(max=self.act["ub"])
            scale = (amax / torch.tensor(E4M3_MAX, dtype=torch.float32)).clamp(min=MIN_SCALE)
            q = (e4m3(xp / scale) * scale.to(torch.float64)).reshape(t, groups * g)[:, :k]
        return bf16(q) if round_bf16 else q

    def __call__(self, x, variant):
        if self.act["kind"] != "none":
            x = self.quantize_input(x, variant == "fp8-bf16-inputs")
        n, k = self.codes.shape
        g = self.group
        groups = self.scales.shape[1]
        pad = groups * g - k
        xs = torch.nn.functional.pad(x, (0, pad)).reshape(x.shape[0], groups, g)
        ws = torch.nn.functional.pad(self.codes, (0, pad)).reshape(n, groups, g)
        partial = torch.einsum("tgk,ngk->tng", xs, ws)
        return (partial * self.scales.unsqueeze(0)).sum(dim=2)


class Bf16Linear:
    def __init__(self, w):
        self.w = w

    def __call__(self, x, variant):
        return x @ self.w.T


def quantize_per_channel(w):
    """A bf16 weight [n, k] quantized as the loader's --quantization fp8 does."""
    wf = w.to(torch.float32)
    amax = wf.abs().amax(dim=1, keepdim=True)
    scale = (amax / torch.tensor(E4M3_MAX, dtype=torch.float32)).clamp(min=MIN_SCALE)
    return e4m3(wf / scale), scale.to(torch.float64)


class Model:
    def __init__(self, directory, quantize_at_load):
        with open(os.path.join(directory, "config.json")) as f:
            c = json.load(f)
        self.c = c
        t = {}
        for name in sorted(os.listdir(directory)):
            if name.endswith(".safetensors"):
                t.update(read_safetensors(os.path.join(directory, name)))
        self.t = t
        self.arch = c["architectures"][0]
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.layers = c["num_hidden_layers"]
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.vocab = c["vocab_size"]
        self.qkv_bias = self.arch.startswith("Qwen2") or c.get("attention_bias", False)
        self.qk_norm = self.arch.startswith("Qwen3")
        rope = dict(c.get("rope_parameters") or {})
        if c.get("rope_scaling"):
            rope.update(c["rope_scaling"])
        self.theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        self.rope = rope
        q = c.get("quantization_config")
        self.quant = q
        if quantize_at_load and q:
            raise ValueError("quantizing an FP8 checkpoint")
        self.act = {"kind": "none"}
        self.block = None
        if q:
            method = q["quant_method"]
            if method == "fbgemm_fp8":
                self.act = {"kind": "dynamic", "ub": q.get("activation_scale_ub")}
            elif method == "fp8":
                self.block = q.get("weight_block_size")
                if q.get("activation_scheme", "dynamic") == "dynamic":
                    self.act = {"kind": "dynamic", "group": self.block[1] if self.block else None}
                else:
                    self.act = {"kind": "static"}
            elif method == "compressed-tensors":
                group = next(iter(q["config_groups"].values()))
                ia = group.get("input_activations")
                if ia is None:
                    self.act = {"kind": "none"}
                elif ia.get("dynamic"):
                    self.act = {"kind": "dynamic", "group": ia.get("group_size") if ia.get("strategy") == "group" else None}
                else:
                    self.act = {"kind": "static"}
            else:
                raise ValueError(f"quant_method {method}")
        elif quantize_at_load:
            self.act = {"kind": "dynamic"}
        self.quantize_at_load = quantize_at_load
        # Whether activations are rounded to bf16 where the engine keeps bf16 values (the CUDA
        # backend's points); False keeps them wide (the CPU backend's f32 activations).
        self.round_activations = True

    def linear(self, prefix, quantized):
        t = self.t
        w = t[f"{prefix}.weight"]
        if not quantized:
            return Bf16Linear(w)
        if self.quantize_at_load:
            codes, scale = quantize_per_channel(w)
            return Fp8Linear(codes, scale, w.shape[1], self.act)
        n, k = w.shape
        if f"{prefix}.weight_scale_inv" in t:
            br, bc = self.block
            s = t[f"{prefix}.weight_scale_inv"]
            rows = s.repeat_interleave(br, dim=0)[:n]
            return Fp8Linear(w, rows, bc, self.act)
        s = t[f"{prefix}.weight_scale"].reshape(-1)
        scales = (s.expand(n) if s.numel() == 1 else s).reshape(n, 1)
        act = dict(self.act)
        if act["kind"] == "static":
            act["scale"] = float(t[f"{prefix}.input_scale"].reshape(-1)[0].to(torch.float32))
        return Fp8Linear(w, scales, k, act)

    def inv_freq(self):
        d = self.head_dim
        inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d))
        if self.rope.get("rope_type") == "llama3":
            factor = self.rope["factor"]
            low, high = self.rope["low_freq_factor"], self.rope["high_freq_factor"]
            original = self.rope["original_max_position_embeddings"]
            low_wavelen, high_wavelen = original / low, original / high
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
            smooth = (original / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            inv = torch.where(medium, smoothed, scaled)
        elif self.rope.get("rope_type") == "linear":
            inv = inv / self.rope["factor"]
        return inv.to(DEVICE)

    def keep(self, t):
        """An activation as the engine keeps it: rounded to bf16, or (``round_activations``
        off) to f32."""
        return bf16(t) if self.round_activations else t.to(torch.float32).to(torch.float64)

    def rmsnorm(self, x, w):
        inv = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.eps)
        return self.keep(x * inv * w)

    def forward(self, ids, variant):
        quantized = variant != "bf16"
        t = self.t
        n = len(ids)
        ids_t = torch.tensor(ids, device=DEVICE)
        x = t["model.embed_tokens.weight"][ids_t].clone()
        inv = self.inv_freq()
        angle = (torch.arange(n, device=DEVICE, dtype=torch.float32).unsqueeze(1) * inv.unsqueeze(0)).to(torch.float64)
        cos, sin = torch.cos(angle), torch.sin(angle)
        half = self.head_dim // 2
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=DEVICE), diagonal=1)

        def rope(v):  # [n, heads, head_dim]
            a, b = v[..., :half], v[..., half:]
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

        def head_norm(v, w):
            inv_rms = torch.rsqrt((v * v).mean(dim=-1, keepdim=True) + self.eps)
            return v * inv_rms * w

        for layer in range(self.layers):
            p = f"model.layers.{layer}"
            h = self.rmsnorm(x, t[f"{p}.input_layernorm.weight"])
            qkv = {}
            for name in ["q_proj", "k_proj", "v_proj"]:
                out = self.linear(f"{p}.self_attn.{name}", quantized)(h, variant)
                if self.qkv_bias:
                    out = out + t[f"{p}.self_attn.{name}.bias"]
                qkv[name] = out
            q = qkv["q_proj"].reshape(n, self.heads, self.head_dim)
            k = qkv["k_proj"].reshape(n, self.kv_heads, self.head_dim)
            v = qkv["v_proj"].reshape(n, self.kv_heads, self.head_dim)
            if self.qk_norm:
                q = head_norm(q, t[f"{p}.self_attn.q_norm.weight"])
                k = head_norm(k, t[f"{p}.self_attn.k_norm.weight"])
            q, k, v = self.keep(rope(q)), self.keep(rope(k)), self.keep(v)
            group = self.heads // self.kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(mask.unsqueeze(0), float("-inf"))
            attn = self.keep(torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v).reshape(n, -1))
            x = x + self.linear(f"{p}.self_attn.o_proj", quantized)(attn, variant)
            h = self.rmsnorm(x, t[f"{p}.post_attention_layernorm.weight"])
            g = self.linear(f"{p}.mlp.gate_proj", quantized)(h, variant)
            u = self.linear(f"{p}.mlp.up_proj", quantized)(h, variant)
            a = self.keep(g / (1 + torch.exp(-g)) * u)
            x = x + self.linear(f"{p}.mlp.down_proj", quantized)(a, variant)
        h = self.rmsnorm(x, t["model.norm.weight"])
        head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
        return (h @ head.T).to(torch.float32)


def main():
    fixtures, out = sys.argv[1], sys.argv[2]
    positions = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(out, exist_ok=True)
    jobs = [(f"fp8/{form}", False, ["fp8", "fp8-bf16-inputs", "fp8-weights", "fp8-weights-f32"])
            for form in ["compressed-tensors-dynamic", "compressed-tensors-static", "fbgemm", "block"]]
    jobs += [(name, True, ["fp8", "fp8-bf16-inputs", "fp8-weights", "fp8-weights-f32", "bf16"])
             for name in ["inferno-tiny", "tiny-qwen2", "tiny-qwen3"]]
    index = {"positions": positions, "models": []}
    for fixture, at_load, variants in jobs:
        model = Model(os.path.join(fixtures, fixture), at_load)
        ids = tokens(model.vocab, positions)
        for variant in variants:
            if variant.startswith("fp8-weights"):
                # The FP8 weights with the inputs left unquantized.
                scheme, model.act = model.act, {"kind": "none"}
                model.round_activations = variant == "fp8-weights"
                logits = model.forward(ids, "fp8").cpu().contiguous()
                model.act, model.round_activations = scheme, True
            else:
                logits = model.forward(ids, variant).cpu().contiguous()
            file = f"{fixture.replace('/', '_')}.{variant}.f32"
            with open(os.path.join(out, file), "wb") as f:
                # Without numpy: the f32 bytes (little-endian on the GPU machines' x86-64).
                f.write(bytes(logits.reshape(-1).view(torch.uint8).tolist()))
            index["models"].append({
                "fixture": fixture,
                "quantize_at_load": at_load,
                "variant": variant,
                "file": file,
                "vocab": model.vocab,
                "tokens": ids,
            })
            print(f"RESULT torch reference {fixture}{' (fp8 at load)' if at_load else ''} {variant}: "
                  f"{positions} positions, max|logit| {logits.abs().max().item():.3f}")
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f)


if __name__ == "__main__":
    main()
