#!/usr/bin/env python3
"""Constrained decoding on the GPU machine (the `constrained` stage of gpu-check.sh).

  constrained_check.py compare CPU_URL CUDA_URL MODEL
      Sends the same greedy constrained requests (json_schema, json_object, regex, choice, a
      required tool call, with and without logit_bias) to a CPU-backend and a CUDA-backend server
      of the same model and reports whether their outputs agree. Where two outputs differ, the
      first differing token is examined on both backends: the prompt and the common prefix are
      sent again as token ids (teacher forcing), once with each of the two candidate tokens forced
      by `logit_bias`, and the raw logprobs of both candidates give each backend's margin between
      them. Both margins within LOGIT_TOLERANCE (0.1, the teacher-forced checks' bound on
      |cuda - cpu| logits) make the difference an explained near-tie; any other difference fails
      (exit status 1). The servers need `server.tool_call_parser` when the model's template shows
      no tool-call format.
  constrained_check.py byte-tokenizer SRC DST
      Makes DST a copy of the model directory SRC (symbolic links) whose tokenizer is a synthetic
      byte-level BPE of the same size: the 256 byte tokens, SRC's added tokens at their ids, and
      random printable multi-byte filler tokens elsewhere. The 8B-shaped benchmark model's
      word-level tokenizer has no token for `{` or `"`, so no JSON grammar could be followed.
  constrained_check.py bench URL MODEL [BATCH...] [--rounds N] [--tokens N]
      Output throughput of JSON-schema-constrained against unconstrained decoding (streamed
      /v1/completions, so a model without a chat template serves) at each batch size (default
      1 and 64; concurrent requests, 128 tokens each), free and constrained runs
      alternating for N rounds (default 3), medians compared; the issue's target is a cost <= 5%
      (ratio constrained/free >= 0.95). Both arms produce exactly N tokens per request (free
      requests ignore EOS; the benchmark schema needs more items than N tokens can write, so its
      grammar never completes); a run where they do not is reported as UNEQUAL and fails. Also
      reports the decode time per token (from each request's first to its last streamed token,
      so prefill and grammar compilation are left out) and its cost, and from /metrics the
      engine's wait for grammar masks per constrained step and the engine thread's own host CPU
      per step in both arms. Prints one RESULT line per batch and a RESULT_JSON line.

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
# The benchmark's schema: a list of strings that needs more items than a request can write (each
# item takes at least 4 bytes, `"", `, and 128 tokens of the byte-level tokenizer hold at most
# 7 bytes each), so the grammar never completes and constrained requests run as long as free
# ones (the old open-ended list ended after 87 tokens on average, which skewed the comparison).
BENCH_MIN_ITEMS = 300
BENCH_SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"},
                                                          "minItems": BENCH_MIN_ITEMS}},
                "required": ["notes"], "additionalProperties": False}
# The teacher-forced CPU/CUDA checks' bound on |cuda - cpu| logits (tests/cuda_backend/).
LOGIT_TOLERANCE = 0.1
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["q", "n"], "additionalProperties": False}}}


def connect(url):
    parsed = urlparse(url)
    return http.client.HTTPSConnection(parsed.hostname, parsed.port, context=CONTEXT, timeout=600)


def post(url, path, body):
    connection = connect(url)
    connection.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    data = json.loads(response.read())
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {data}")
    return data


def mask_wait(url):
    """The engine's grammar-mask totals from /metrics: (steps, overlapped steps, seconds waited),
    or None from a server without them."""
    connection = connect(url)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    values = {}
    for line in text.splitlines():
        for name in ("grammar_mask_steps", "grammar_mask_overlapped_steps", "grammar_mask_wait_seconds"):
            if line.startswith(f"inferno:{name}{{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    if len(values) < 3:
        return None
    return values["grammar_mask_steps"], values["grammar_mask_overlapped_steps"], values["grammar_mask_wait_seconds"]


def engine_cpu(url):
    """The engine thread's CPU seconds from /metrics: {"host": ..., "backend_step": ...}, or None
    from a server without them."""
    connection = connect(url)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    parts = {}
    for line in text.splitlines():
        if line.startswith("inferno:engine_thread_cpu_seconds_total{"):
            for part in ("host", "backend_step"):
                if f'part="{part}"' in line:
                    parts[part] = float(line.rsplit(" ", 1)[1])
    return parts if len(parts) == 2 else None


def token_id(url, model, text):
    """The id of the token whose text is `text` (it must tokenize to one token that decodes back)."""
    ids = post(url, "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})["tokens"]
    if len(ids) != 1 or post(url, "/detokenize", {"model": model, "tokens": ids})["prompt"] != text:
        raise RuntimeError(f"no single token for {text!r} (tokenizes to {ids})")
    return ids[0]


def forced_logprob(url, model, prompt_ids, token):
    """The raw logprob of `token` after `prompt_ids`: `logit_bias` forces it, logprobs are raw."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": 1, "temperature": 0, "logprobs": 1,
            "logit_bias": {str(token): 100}}
    return post(url, "/v1/completions", body)["choices"][0]["logprobs"]["token_logprobs"][0]


def explain_difference(cpu, cuda, model, body, tokens, logprobs):
    """Teacher-forces the first differing token of two greedy outputs on both backends and returns
    (explained, description): each backend's margin between its own choice and the other's.
    `tokens` and `logprobs` are the two runs' token texts and logprobs (CPU first): the forced
    logprob of each backend's own choice must reproduce its run's within LOGIT_TOLERANCE, or the
    forcing went wrong."""
    cpu_tokens, cuda_tokens = tokens
    i = next((i for i, (a, b) in enumerate(zip(cpu_tokens, cuda_tokens)) if a != b),
             min(len(cpu_tokens), len(cuda_tokens)))
    if i == len(cpu_tokens) or i == len(cuda_tokens):
        return False, f"one output is a prefix of the other (token {i}): not a near-tie"
    try:
        prompt = post(cpu, "/tokenize", {"model": model, "messages": body["messages"],
                                          "add_generation_prompt": True,
                                          **({"tools": body["tools"]} if "tools" in body else {})})["tokens"]
        prefix = [token_id(cpu, model, text) for text in cpu_tokens[:i]]
        a, b = token_id(cpu, model, cpu_tokens[i]), token_id(cpu, model, cuda_tokens[i])
        margins = {}
        for name, url in (("cpu", cpu), ("cuda", cuda)):
            lp_a = forced_logprob(url, model, prompt + prefix, a)
            lp_b = forced_logprob(url, model, prompt + prefix, b)
            margins[name] = (lp_a, lp_b, lp_a - lp_b)
    except RuntimeError as err:
        return False, f"token {i} ({cpu_tokens[i]!r} vs {cuda_tokens[i]!r}) could not be teacher-forced: {err}"
    # The forced request computes the position in a prefill, the run computed it in a decode step:
    # on the GPU their kernels round differently (0.0064 on the H100), within the checks' bound.
    reproduced = (abs(margins["cpu"][0] - logprobs[0][i]) <= LOGIT_TOLERANCE
                  and abs(margins["cuda"][1] - logprobs[1][i]) <= LOGIT_TOLERANCE)
    if not reproduced:
        return False, (f"token {i}: teacher forcing did not reproduce the runs' logprobs (cpu {logprobs[0][i]:.4f} "
                       f"forced {margins['cpu'][0]:.4f}, cuda {logprobs[1][i]:.4f} forced {margins['cuda'][1]:.4f})")
    explained = all(abs(m[2]) <= LOGIT_TOLERANCE for m in margins.values())
    text = (f"first difference at token {i}: cpu {cpu_tokens[i]!r} (id {a}) vs cuda {cuda_tokens[i]!r} (id {b}); "
            f"run logprobs cpu {logprobs[0][i]:.4f}, cuda {logprobs[1][i]:.4f}; forced: "
            + "; ".join(f"{name} logprobs {m[0]:.4f} / {m[1]:.4f}, margin {m[2]:+.4f}" for name, m in margins.items())
            + f" -> {'near-tie within' if explained else 'NOT within'} {LOGIT_TOLERANCE}")
    return explained, text


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
    agree = explained = 0
    for name, extra in cases.items():
        body = {"model": model, "messages": messages, "max_tokens": 128, "temperature": 0,
                "logprobs": True, "top_logprobs": 5, **extra}
        outputs, tokens, logprobs = [], [], []
        for url in (cpu, cuda):
            choice = post(url, "/v1/chat/completions", body)["choices"][0]
            message = choice["message"]
            outputs.append(json.dumps({"content": message.get("content"),
                                       "tool_calls": [c["function"] for c in message.get("tool_calls") or []]}))
            content = (choice.get("logprobs") or {}).get("content") or []
            tokens.append([t["token"] for t in content])
            logprobs.append([t["logprob"] for t in content])
        same = outputs[0] == outputs[1]
        agree += same
        print(f"RESULT compare {name}: {'agree' if same else 'DIFFER'} cpu={outputs[0][:160]} cuda={outputs[1][:160]}")
        if not same:
            ok, text = explain_difference(cpu, cuda, model, body, tokens, logprobs)
            explained += ok
            print(f"RESULT compare {name}: {text}")
    print(f"RESULT compare: {agree}/{len(cases)} constrained outputs agree between CPU and CUDA, "
          f"{explained} of the {len(cases) - agree} differences explained by a near-tie")
    return agree + explained == len(cases)


def stream_one(url, body):
    """Streams one completion; returns (completion tokens, seconds from the first to the last
    token chunk, how many chunks carried text)."""
    connection = connect(url)
    connection.request("POST", "/v1/completions",
                       json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
                       {"content-type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"/v1/completions: {response.status} {response.read()[:300]!r}")
    first = last = None
    chunks, usage = 0, None
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            usage = event["usage"]
        if any(c.get("text") for c in event.get("choices", [])):
            last = time.perf_counter()
            first = first or last
            chunks += 1
    connection.close()
    if usage is None or first is None:
        raise RuntimeError("the stream ended without tokens or usage")
    return usage["completion_tokens"], last - first, chunks


def run_batch(url, model, batch, constrained, max_tokens):
    """One round: `batch` concurrent streamed requests. Returns (output tok/s over the round,
    tokens of each request, mean decode seconds per token over the requests)."""
    results = [None] * batch
    errors = []

    def one(i):
        body = {"model": model, "prompt": f"Write notes {i} as JSON:", "max_tokens": max_tokens,
                "temperature": 1.0, "seed": i, "ignore_eos": True}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "n", "schema": BENCH_SCHEMA}}
        try:
            results[i] = stream_one(url, body)
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
    tokens = [n for n, _, _ in results]
    per_token = [span / (n - 1) for n, span, _ in results if n > 1]
    return sum(tokens) / elapsed, tokens, statistics.mean(per_token) if per_token else float("nan")


def bench(url, model, batches, rounds, max_tokens):
    # Warm-up: kernels, decode graphs, the grammar compiler's tokenizer.
    run_batch(url, model, 4, True, 16)
    run_batch(url, model, 4, False, 16)
    summary, fair = [], True
    for batch in batches:
        arms = {False: {"rates": [], "tokens": [], "step": []}, True: {"rates": [], "tokens": [], "step": []}}
        waits = []  # per constrained round: (steps, overlapped steps, seconds) from /metrics
        host_cpu = {False: [], True: []}  # per round: engine host CPU seconds per decode step
        for _ in range(rounds):
            for constrained in (False, True):
                before = mask_wait(url) if constrained else None
                cpu_before = engine_cpu(url)
                rate, tokens, step = run_batch(url, model, batch, constrained, max_tokens)
                cpu_after = engine_cpu(url)
                if cpu_before and cpu_after:
                    # A round is about max_tokens decode steps (every request runs them together).
                    host_cpu[constrained].append((cpu_after["host"] - cpu_before["host"]) / max_tokens)
                after = mask_wait(url) if constrained else None
                if before and after:
                    waits.append(tuple(b - a for a, b in zip(before, after)))
                arms[constrained]["rates"].append(rate)
                arms[constrained]["tokens"] += tokens
                arms[constrained]["step"].append(step)
        free, constrained = arms[False], arms[True]
        free_rate, constrained_rate = statistics.median(free["rates"]), statistics.median(constrained["rates"])
        free_step, constrained_step = statistics.median(free["step"]), statistics.median(constrained["step"])
        ratio = constrained_rate / free_rate
        cost = 100.0 * (1.0 - ratio)
        step_cost = 100.0 * (constrained_step / free_step - 1.0)
        # Like with like: every request of both arms must have produced max_tokens tokens.
        equal = set(free["tokens"]) == set(constrained["tokens"]) == {max_tokens}
        fair &= equal
        verdict = ("within" if cost <= 5.0 else "OVER") if equal else "UNEQUAL token counts, no verdict:"
        wait_steps = sum(w[0] for w in waits)
        wait_us = 1e6 * sum(w[2] for w in waits) / wait_steps if wait_steps else None
        wait_text = (f"; engine wait for masks {wait_us:.0f} us per constrained step over {wait_steps:.0f} steps "
                     f"({sum(w[1] for w in waits):.0f} overlapped with the forward pass)" if wait_us is not None else "")
        if host_cpu[False] and host_cpu[True]:
            free_cpu, constrained_cpu = statistics.median(host_cpu[False]), statistics.median(host_cpu[True])
            wait_text += (f"; engine thread host CPU per step (excluding backend steps, about "
                          f"{max_tokens} steps a round) free {1e3 * free_cpu:.3f} ms, json_schema "
                          f"{1e3 * constrained_cpu:.3f} ms")
        else:
            free_cpu = constrained_cpu = None
        print(f"RESULT bench batch={batch}: free {free_rate:.1f} tok/s, json_schema {constrained_rate:.1f} tok/s "
              f"(medians of {rounds}), ratio {ratio:.3f}, cost {cost:.1f}% ({verdict} the 5% target); "
              f"decode per token free {1e3 * free_step:.3f} ms, json_schema {1e3 * constrained_step:.3f} ms "
              f"(cost {step_cost:.1f}%); tokens per request free {statistics.mean(free['tokens']):.1f} "
              f"(min {min(free['tokens'])}), json_schema {statistics.mean(constrained['tokens']):.1f} "
              f"(min {min(constrained['tokens'])}){wait_text}")
        summary.append({"batch": batch, "rounds": rounds, "max_tokens": max_tokens,
                        "free_tok_s": [round(r, 2) for r in free["rates"]],
                        "json_schema_tok_s": [round(r, 2) for r in constrained["rates"]],
                        "free_median": round(free_rate, 2), "json_schema_median": round(constrained_rate, 2),
                        "ratio": round(ratio, 4), "cost_percent": round(cost, 2),
                        "free_decode_ms_per_token": round(1e3 * free_step, 4),
                        "json_schema_decode_ms_per_token": round(1e3 * constrained_step, 4),
                        "decode_cost_percent": round(step_cost, 2),
                        "mask_wait_us_per_step": None if wait_us is None else round(wait_us, 1),
                        "mask_wait_steps": wait_steps,
                        "mask_wait_overlapped_steps": sum(w[1] for w in waits),
                        "engine_host_cpu_ms_per_step_free": None if free_cpu is None else round(1e3 * free_cpu, 4),
                        "engine_host_cpu_ms_per_step_json_schema":
                            None if constrained_cpu is None else round(1e3 * constrained_cpu, 4),
                        "equal_tokens": equal, "within_target": equal and cost <= 5.0,
                        "json_schema_tokens_per_request": round(statistics.mean(constrained["tokens"]), 1)})
    print("RESULT_JSON " + json.dumps({"model": model, "bench": summary}))
    return fair


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
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "compare":
        sys.exit(0 if compare(sys.argv[2], sys.argv[3], sys.argv[4]) else 1)
    elif sys.argv[1] == "byte-tokenizer":
        byte_tokenizer(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "bench":
        sys.exit(0 if bench(sys.argv[2], sys.argv[3], *bench_args(sys.argv[4:])) else 1)
    else:
        sys.exit(__doc__)
