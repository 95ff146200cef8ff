#!/usr/bin/env python3
"""Device ceilings and transformers peers, on the GPU machine.

Measures (1) copy bandwidth: pinned host->device, device->host and device->device; (2) the bf16
GEMM rate (8192^3, random inputs); (3) transformers generation on the given model directory,
eager and with a static cache (which generate() compiles with torch.compile), at fixed input/output lengths. Writes JSON.
Usage: peers.py MODEL_DIR OUT_JSON [--skip-compile] [--batches 1,16] [--input-len 128]
       [--output-len 128]
"""
import argparse
import json
import time

import torch


def timed(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def ceilings():
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 255)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d = timed(lambda: dev.copy_(host, non_blocking=True), 5)
    d2h = timed(lambda: host.copy_(dev, non_blocking=True), 5)
    d2d = timed(lambda: dev2.copy_(dev), 10)
    small = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
    small_dev = torch.empty(4096, dtype=torch.uint8, device="cuda")
    h2d_small = timed(lambda: small_dev.copy_(small, non_blocking=True), 200)
    del dev, dev2
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    gemm = timed(lambda: a @ b, 20)
    return {
        "h2d_pinned_GBps": n / h2d / 1e9,
        "d2h_pinned_GBps": n / d2h / 1e9,
        "d2d_GBps_read_plus_write": 2 * n / d2d / 1e9,
        "h2d_4KiB_latency_us": h2d_small * 1e6,
        "gemm_8192_bf16_TFLOPs": 2 * m**3 / gemm / 1e12,
    }


def generate_rate(model, batch, input_len, output_len, vocab):
    ids = torch.randint(1000, vocab - 1000, (batch, input_len), device="cuda")
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
    t = time.time()
    model.generate(ids, attention_mask=mask, **kwargs)
    torch.cuda.synchronize()
    warmup = time.time() - t
    t = time.time()
    out = model.generate(ids, attention_mask=mask, **kwargs)
    torch.cuda.synchronize()
    elapsed = time.time() - t
    new = (out.shape[1] - input_len) * batch
    return {"batch": batch, "input_len": input_len, "output_len": output_len, "seconds": elapsed, "warmup_seconds": warmup, "output_tok_per_s": new / elapsed}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)

    result["ceilings"] = ceilings()
    print(json.dumps(result["ceilings"]), flush=True)
    save()
    import transformers
    from transformers import AutoModelForCausalLM

    result["transformers"] = transformers.__version__
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map="cuda", attn_implementation="sdpa")
    model.eval()
    vocab = model.config.vocab_size
    batches = [int(b) for b in args.batches.split(",")]
    result["eager"] = []
    with torch.inference_mode():
        for b in batches:
            r = generate_rate(model, b, args.input_len, args.output_len, vocab)
            print("eager", json.dumps(r), flush=True)
            result["eager"].append(r)
            save()
        if not args.skip_compile:
            # With a static cache, generate() compiles the decode step itself (its default
            # CompileConfig: torch.compile with mode "reduce-overhead", i.e. CUDA graphs).
            model.generation_config.cache_implementation = "static"
            result["static_compile"] = []
            for b in batches:
                r = generate_rate(model, b, args.input_len, args.output_len, vocab)
                print("static+compile", json.dumps(r), flush=True)
                result["static_compile"].append(r)
                save()


if __name__ == "__main__":
    main()
