#!/usr/bin/env python3
"""Embeddings on the GPU machine (the `embed` stage of gpu-check.sh, issue 46).

  embed_check.py compare CPU_URL CUDA_URL
      Sends the same `/v1/embeddings` requests (one input; 16 inputs of different lengths in one
      request, so several rows end in one step; a long input that is prefilled in chunks) to a
      CPU-backend and a CUDA-backend server of the same embedding model, and checks that every
      CUDA embedding has a cosine similarity >= 0.999 with the CPU one (exit status 1 otherwise).
      Prints one RESULT line.
  embed_check.py ratio PREFILL_JSON... -- EMBED_JSON...
      The `bench offline` reports of prefill runs (1 output token) and embedding runs of the same
      prompts: the median duration of each kind and their ratio (target <= 1.2). Prints one
      RESULT line and a RESULT_JSON line; exit status 1 over the target.

Standard library only; the servers' self-signed certificates are not verified (local only).
"""
import http.client
import json
import math
import ssl
import statistics
import sys
from urllib.parse import urlparse

CONTEXT = ssl._create_unverified_context()
MIN_COSINE = 0.999
TARGET_RATIO = 1.2
WORDS = "confidential inference keeps prompts sealed inside the attested enclave while the gpu computes".split()


def post(url, path, body):
    parsed = urlparse(url)
    connection = http.client.HTTPSConnection(parsed.hostname, parsed.port, context=CONTEXT, timeout=120)
    connection.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {data[:300]!r}")
    return json.loads(data)


def model_id(url):
    parsed = urlparse(url)
    connection = http.client.HTTPSConnection(parsed.hostname, parsed.port, context=CONTEXT, timeout=30)
    connection.request("GET", "/v1/models")
    return json.loads(connection.getresponse().read())["data"][0]["id"]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def text(words):
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def compare(cpu, cuda):
    model, cuda_model = model_id(cpu), model_id(cuda)
    requests = [
        ["What is the capital of France?"],
        [text(3 + 5 * i) for i in range(16)],
        [text(300)],
    ]
    worst, count = 1.0, 0
    for inputs in requests:
        a = post(cpu, "/v1/embeddings", {"model": model, "input": inputs})["data"]
        b = post(cuda, "/v1/embeddings", {"model": cuda_model, "input": inputs})["data"]
        if len(a) != len(inputs) or len(b) != len(inputs):
            raise RuntimeError(f"{len(inputs)} inputs, {len(a)} CPU and {len(b)} CUDA embeddings")
        for x, y in zip(a, b):
            worst = min(worst, cosine(x["embedding"], y["embedding"]))
            count += 1
    ok = worst >= MIN_COSINE
    print(f"RESULT embed compare {model}: {count} embeddings, lowest CPU/CUDA cosine {worst:.6f} "
          f"({'within' if ok else 'BELOW'} the {MIN_COSINE} bound)")
    return ok


def ratio(args):
    split = args.index("--")
    reports = {path: json.load(open(path)) for path in args if path != "--"}
    failed = {path: r["failed"] for path, r in reports.items() if r.get("failed")}
    if failed:
        print(f"RESULT embed bench: failed requests, no verdict: {failed}")
        return False
    prefill = [reports[p]["duration_s"] for p in args[:split]]
    embed = [reports[p]["duration_s"] for p in args[split + 1:]]
    p, e = statistics.median(prefill), statistics.median(embed)
    r = e / p
    ok = r <= TARGET_RATIO
    print(f"RESULT embed bench: embeddings {e:.3f} s, prefill of the same tokens {p:.3f} s (medians of "
          f"{len(embed)} and {len(prefill)}), ratio {r:.3f} ({'within' if ok else 'OVER'} the {TARGET_RATIO} target)")
    print("RESULT_JSON " + json.dumps({"prefill_s": prefill, "embeddings_s": embed, "ratio": round(r, 4),
                                       "within_target": ok}))
    return ok


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "compare":
        sys.exit(0 if compare(sys.argv[2], sys.argv[3]) else 1)
    elif len(sys.argv) >= 5 and sys.argv[1] == "ratio" and "--" in sys.argv:
        sys.exit(0 if ratio(sys.argv[2:]) else 1)
    sys.exit(__doc__)
