#!/usr/bin/env python3
"""Constrained decoding on the GPU machine (the `constrained` stage of gpu-check.sh).

  constrained_check.py compare CPU_URL CUDA_URL MODEL
      Sends the same greedy constrained requests (json_schema, regex, choice, a required tool
      call) to a CPU-backend and a CUDA-backend server of the same model and reports whether
      their outputs agree.
  constrained_check.py bench URL MODEL
      Output throughput of JSON-schema-constrained against unconstrained decoding at batch 1
      and 64 (concurrent requests, 128 tokens each); the issue's target is a cost <= 5%.

Standard library only; the servers' self-signed certificates are not verified (local only).
"""
import http.client
import json
import ssl
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


def run_batch(url, model, batch, constrained):
    tokens = [0] * batch
    errors = []

    def one(i):
        body = {"model": model, "messages": [{"role": "user", "content": f"Write notes {i}."}],
                "max_tokens": 128, "temperature": 1.0, "seed": i, "ignore_eos": True}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "n", "schema": BENCH_SCHEMA}}
        try:
            tokens[i] = post(url, "/v1/chat/completions", body)["usage"]["completion_tokens"]
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


def bench(url, model):
    run_batch(url, model, 4, True)  # warm-up: kernels, graphs, the grammar compiler
    for batch in (1, 64):
        free, free_tokens = run_batch(url, model, batch, False)
        constrained, constrained_tokens = run_batch(url, model, batch, True)
        cost = 100.0 * (1.0 - constrained / free)
        verdict = "within" if cost <= 5.0 else "OVER"
        print(f"RESULT bench batch={batch}: free {free:.1f} tok/s ({free_tokens} tokens), "
              f"json_schema {constrained:.1f} tok/s ({constrained_tokens} tokens), cost {cost:.1f}% ({verdict} the 5% target)")


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
