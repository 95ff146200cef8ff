#!/usr/bin/env python3
"""Constrained decoding on the GPU machine (the `constrained` stage of gpu-check.sh).

  constrained_check.py compare CPU_URL CUDA_URL MODEL
      Sends the same greedy constrained requests (json_schema, json_object, regex, choice, a
      required tool call, with and without logit_bias) to a CPU-backend and a CUDA-backend server
      of the same model and reports whether their outputs agree. The servers need
      `server.tool_call_parser` when the model's template shows no tool-call format.
  constrained_check.py byte-tokenizer SRC DST
      Makes DST a copy of the model directory SRC (symbolic links) whose tokenizer is a synthetic
      byte-level BPE of the same size: the 256 byte tokens, SRC's added tokens at their ids, and
      random printable multi-byte filler tokens elsewhere. The 8B-shaped benchmark model's
      word-level tokenizer has no token for `{` or `"`, so no JSON grammar could be followed.
  constrained_check.py bench URL MODEL [BATCH...] [--rounds N] [--tokens N]
      Output throughput of JSON-schema-constrained against unconstrained decoding (plain
      /v1/completions, so a model without a chat template serves) at each batch size (default
      1 and 64; concurrent requests, 128 tokens each), free and constrained runs
      alternating for N rounds (default 3), medians compared; the issue's target is a cost <= 5%
      (ratio constrained/free >= 0.95). Prints one RESULT line per batch and a RESULT_JSON line.

Standard library only; the servers' self-signed certificates are not verified (local only).
"""
import http.client
import json
import os
import random
import ssl
import statistics
import string
import sys
import threading
import time
from urllib.parse import urlparse

CONTEXT = ssl._create_unverified_context()

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
# Long outputs for the benchmark: an open-ended list, so the grammar rarely ends early.
BENCH_SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
                "required": ["notes"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["q", "n"], "additionalProperties": False}}}


def post(url, path, body):
    parsed = urlparse(url)
    connection = http.client.HTTPSConnection(parsed.hostname, parsed.port, context=CONTEXT, timeout=600)
    connection.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    data = json.loads(response.read())
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {data}")
    return data


def compare(cpu, cuda, model):
    messages = [{"role": "user", "content": "Describe a user."}]
    cases = {
        "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": SCHEMA}}},
        "json_object": {"response_format": {"type": "json_object"}, "max_tokens": 64},
        "regex": {"guided_regex": "[A-Z][a-z]{3,8} [0-9]{2,4}"},
        "choice": {"guided_choice": ["red", "green", "blue"]},
        "tool_required": {"tools": [TOOL], "tool_choice": "required"},
        # The device sampler applies biases too (token ids below every fixture's vocabulary).
        "json_object+logit_bias": {"response_format": {"type": "json_object"}, "max_tokens": 48,
                                   "logit_bias": {"90": 6, "101": -100, "260": 4.5, "300": 3}},
        "logit_bias": {"max_tokens": 24, "logit_bias": {"40": 9, "41": 9, "42": 9, "43": -2}},
    }
    agree = 0
    for name, extra in cases.items():
        body = {"model": model, "messages": messages, "max_tokens": 128, "temperature": 0, **extra}
        outputs = []
        for url in (cpu, cuda):
            message = post(url, "/v1/chat/completions", body)["choices"][0]["message"]
            outputs.append(json.dumps({"content": message.get("content"),
                                       "tool_calls": [c["function"] for c in message.get("tool_calls", [])]}))
        same = outputs[0] == outputs[1]
        agree += same
        print(f"RESULT compare {name}: {'agree' if same else 'DIFFER'} cpu={outputs[0][:160]} cuda={outputs[1][:160]}")
    print(f"RESULT compare: {agree}/{len(cases)} constrained outputs agree between CPU and CUDA")


def run_batch(url, model, batch, constrained, max_tokens):
    tokens = [0] * batch
    errors = []

    def one(i):
        body = {"model": model, "prompt": f"Write notes {i} as JSON:", "max_tokens": max_tokens,
                "temperature": 1.0, "seed": i, "ignore_eos": True}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "n", "schema": BENCH_SCHEMA}}
        try:
            tokens[i] = post(url, "/v1/completions", body)["usage"]["completion_tokens"]
        except Exception as err:  # reported below
            errors.append(str(err))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(errors[0])
    return sum(tokens) / elapsed, sum(tokens)


def bench(url, model, batches, rounds, max_tokens):
    # Warm-up: kernels, decode graphs, the grammar compiler's tokenizer.
    run_batch(url, model, 4, True, 16)
    run_batch(url, model, 4, False, 16)
    summary = []
    for batch in batches:
        free, constrained, free_tokens, constrained_tokens = [], [], 0, 0
        for _ in range(rounds):
            rate, n = run_batch(url, model, batch, False, max_tokens)
            free.append(rate)
            free_tokens += n
            rate, n = run_batch(url, model, batch, True, max_tokens)
            constrained.append(rate)
            constrained_tokens += n
        free_rate = statistics.median(free)
        constrained_rate = statistics.median(constrained)
        ratio = constrained_rate / free_rate
        cost = 100.0 * (1.0 - ratio)
        verdict = "within" if cost <= 5.0 else "OVER"
        # A grammar that ends early makes shorter requests: say how long they ran.
        per_request = constrained_tokens / (rounds * batch)
        print(f"RESULT bench batch={batch}: free {free_rate:.1f} tok/s, json_schema {constrained_rate:.1f} tok/s "
              f"(medians of {rounds}), ratio {ratio:.3f}, cost {cost:.1f}% ({verdict} the 5% target); "
              f"tokens per request free {free_tokens / (rounds * batch):.1f}, json_schema {per_request:.1f}")
        summary.append({"batch": batch, "rounds": rounds, "max_tokens": max_tokens,
                        "free_tok_s": [round(r, 2) for r in free],
                        "json_schema_tok_s": [round(r, 2) for r in constrained],
                        "free_median": round(free_rate, 2), "json_schema_median": round(constrained_rate, 2),
                        "ratio": round(ratio, 4), "cost_percent": round(cost, 2), "within_target": cost <= 5.0,
                        "json_schema_tokens_per_request": round(per_request, 1)})
    print("RESULT_JSON " + json.dumps({"model": model, "bench": summary}))


def byte_level_alphabet():
    """Byte -> the printable character that byte-level BPE vocabularies use for it."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


def byte_tokenizer(src, dst):
    source = json.load(open(os.path.join(src, "tokenizer.json")))
    added = {token["id"]: token for token in source.get("added_tokens", [])}
    size = max([len(source["model"]["vocab"])] + [i + 1 for i in added])
    alphabet = byte_level_alphabet()
    free_ids = [i for i in range(size) if i not in added]
    if len(free_ids) < 256:
        sys.exit(f"{src}: only {len(free_ids)} ids for the 256 byte tokens")
    vocab, seen = {}, set()
    for byte, token_id in zip(range(256), free_ids):
        vocab[alphabet[byte]] = token_id
        seen.add(alphabet[byte])
    rng = random.Random(16)
    characters = [ord(c) for c in string.ascii_letters + string.digits + ' {}[]":,._-']
    for token_id in free_ids[256:]:
        while True:
            text = "".join(alphabet[rng.choice(characters)] for _ in range(rng.randint(2, 7)))
            if text not in seen:
                break
        seen.add(text)
        vocab[text] = token_id
    level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added[i] for i in sorted(added)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **level},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        target = os.path.join(dst, name)
        if name != "tokenizer.json" and not os.path.lexists(target):
            os.symlink(os.path.abspath(os.path.join(src, name)), target)
    with open(os.path.join(dst, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    print(f"{dst}: byte-level tokenizer of {size} tokens ({len(added)} added)")


def bench_args(args):
    batches, rounds, max_tokens = [], 3, 128
    while args:
        arg = args.pop(0)
        if arg == "--rounds":
            rounds = int(args.pop(0))
        elif arg == "--tokens":
            max_tokens = int(args.pop(0))
        else:
            batches.append(int(arg))
    return batches or [1, 64], rounds, max_tokens


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "byte-tokenizer":
        byte_tokenizer(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3], *bench_args(sys.argv[4:]))
    else:
        sys.exit(__doc__)
