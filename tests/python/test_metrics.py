"""`/metrics` of a real `inferno serve`, parsed with the `prometheus_client` parsers.

The server (INFERNO_BIN, default target/debug/inferno) serves the embedded model on the CPU in the
development profile, with a scrape key. Both exposition formats are read as served: OpenMetrics
(asked for by `Accept`) and the 0.0.4 text format (the default). Every family must have the type
it is declared with, and none may be `unknown` (what a counter announced under one name and
sampled under another turns into). Per-principal series are shown only to the scrape key.
"""

import hashlib
import http.client
import os
import re
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

try:
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_openmetrics,
    )
    from prometheus_client.parser import text_string_to_metric_families as parse_text
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip(
        "needs the prometheus-client package (pip install prometheus-client)",
        allow_module_level=True,
    )

REPO = Path(__file__).resolve().parents[2]
API_KEY = "metrics-test-api-key"
SCRAPE_KEY = "metrics-test-scrape-key"
STARTUP_TIMEOUT_S = 120

# Every family the server declares, and its type.
EXPECTED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:cache_config_info": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    # A histogram whose vLLM name ends in `_total` (`_types` strips it).
    "vllm:iteration_tokens": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_success": "counter",
    "inferno:api_requests": "counter",
    "inferno:engine_steps": "counter",
    "inferno:engine_thread_cpu_seconds": "counter",
    "inferno:grammar_mask_steps": "gauge",
    "inferno:grammar_mask_overlapped_steps": "gauge",
    "inferno:grammar_mask_wait_seconds": "gauge",
    "inferno:spec_decode_num_drafts": "counter",
    "inferno:spec_decode_num_draft_tokens": "counter",
    "inferno:spec_decode_num_accepted_tokens": "counter",
    "inferno:spec_decode_acceptance_rate": "gauge",
    "inferno:spec_decode_accepted_tokens_per_step": "gauge",
    "inferno:audit_enabled": "gauge",
    "inferno:audit_fail_closed": "gauge",
    "inferno:audit_records": "gauge",
    "inferno:audit_records_behind_checkpoint": "gauge",
    "inferno:audit_checkpoint_age_seconds": "gauge",
    "inferno:attestation_verdict": "gauge",
    "inferno:attestation_evidence_age_seconds": "gauge",
    "inferno:build_info": "gauge",
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
    "process_start_time_seconds": "gauge",
}
PRIVATE = {"inferno:api_requests_by_principal": "counter"}


def _binary() -> Path:
    path = Path(os.environ.get("INFERNO_BIN", REPO / "target" / "debug" / "inferno"))
    if not path.is_file():
        pytest.fail(f"inferno binary not found at {path}; build it or set INFERNO_BIN")
    return path


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "inferno.toml"
        config.write_text(
            '[attestation]\nprofile = "development"\n'
            '[server]\nlisten = "127.0.0.1:0"\nshutdown_grace_secs = 1\n'
            f'[metrics]\nkey_sha256 = "{hashlib.sha256(SCRAPE_KEY.encode()).hexdigest()}"\n'
            f'[[auth.keys]]\nname = "alice"\nsha256 = "{hashlib.sha256(API_KEY.encode()).hexdigest()}"\n'
        )
        process = subprocess.Popen(
            [str(_binary()), "serve", "--config", str(config), "--device", "cpu"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        log: list[str] = []
        ready = threading.Event()
        port: list[int] = []

        def read_log():
            for line in process.stderr:
                log.append(line)
                if match := re.search(r"listening:\s+https://127\.0\.0\.1:(\d+)", line):
                    port.append(int(match.group(1)))
                if line.strip().startswith("metrics:"):
                    ready.set()

        threading.Thread(target=read_log, daemon=True).start()
        try:
            if not ready.wait(STARTUP_TIMEOUT_S):
                pytest.fail("server did not become ready:\n" + "".join(log))
            yield port[0]
        finally:
            process.terminate()
            process.wait(timeout=30)


def _get(port: int, path: str, headers: dict, body: bytes | None = None):
    # Trust is not what this test is about (test_openai_client.py pins the certificate).
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    connection.request("POST" if body else "GET", path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type"), response.read().decode()


def _complete(port: int):
    status, _, _ = _get(
        port,
        "/v1/completions",
        {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        b'{"model": "inferno-tiny", "prompt": "Once", "max_tokens": 3, "ignore_eos": true, "temperature": 0}',
    )
    assert status == 200


def _types(families) -> dict:
    # The text parser names a counter family as OpenMetrics does, without `_total`.
    return {family.name.removesuffix("_total"): family.type for family in families}


def test_openmetrics_is_served_when_accepted_and_every_type_parses(server):
    _complete(server)
    status, content_type, text = _get(
        server,
        "/metrics",
        {
            "Authorization": f"Bearer {SCRAPE_KEY}",
            "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.4",
        },
    )
    assert status == 200
    assert content_type == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    types = _types(parse_openmetrics(text))
    assert types == EXPECTED | PRIVATE
    assert 'principal="alice"' in text


def test_the_0_0_4_text_format_is_the_default_and_every_type_parses(server):
    _complete(server)
    status, content_type, text = _get(server, "/metrics", {"Authorization": f"Bearer {SCRAPE_KEY}"})
    assert status == 200
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert "# EOF" not in text
    families = list(parse_text(text))
    types = _types(families)
    assert "unknown" not in types.values(), types
    assert types == EXPECTED | PRIVATE
    by_name = {f.name: f for f in families}
    tokens = by_name["vllm:generation_tokens"]
    assert sum(sample.value for sample in tokens.samples) >= 3
    # vLLM's request phases and per-step tokens moved with the completions: every series has
    # counted at least one request (or step).
    for name in (
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:iteration_tokens_total",
    ):
        counts = [s for s in by_name[name].samples if s.name == f"{name}_count"]
        assert counts and counts[0].labels == {"model_name": "inferno-tiny"}, counts
        assert counts[0].value >= 1, (name, counts)
    steps = by_name["vllm:iteration_tokens_total"].samples
    assert next(s.value for s in steps if s.name == "vllm:iteration_tokens_total_sum") >= 3


def test_an_api_key_reads_no_principal_names(server):
    _complete(server)
    status, _, text = _get(server, "/metrics", {"Authorization": f"Bearer {API_KEY}"})
    assert status == 200
    assert "alice" not in text
    assert _types(parse_text(text)) == EXPECTED
    status, _, _ = _get(server, "/metrics", {})
    assert status == 401
