"""The real `openai` Python client, unmodified, through `inferno proxy` to a real `inferno serve`.

Every test runs through both of the proxy's transports:
- attested TLS: the proxy verifies the server (certificate evidence, fresh evidence bound to its
  own TLS connection, policy/client-development.toml: the simulated TEE) before it forwards a byte;
- Oblivious HTTP (`--ohttp`): the proxy fetches the server's key configuration, asks for fresh
  evidence with a nonce sealed to it, checks that the evidence names that key, and then seals
  every request to it (RFC 9458; streamed answers in chunked OHTTP).

The proxy serves plain HTTP on loopback. The client knows nothing of TLS, OHTTP or attestation:
it only gets a base URL and reads the verified measurement and model digest from the response
headers.
"""

import json
import re
import subprocess
import tempfile
import threading
from pathlib import Path

import openai
import pytest

from test_openai_client import API_KEY, REPO, RunningServer, _binary

PROXY_TIMEOUT_S = 60


class RunningProxy:
    """An `inferno proxy` subprocess in front of a server."""

    def __init__(self, upstream_port: int, extra_args: tuple[str, ...] = ()):
        self.process = subprocess.Popen(
            [
                str(_binary()),
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                f"https://127.0.0.1:{upstream_port}",
                "--policy",
                str(REPO / "policy" / "client-development.toml"),
                *extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self.ready = threading.Event()
        self.base = None
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self.ready.wait(PROXY_TIMEOUT_S):
            self.stop()
            pytest.fail("proxy did not start:\n" + "".join(self.log))

    def _read_log(self):
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if match := re.search(r"listening:\s+(http://127\.0\.0\.1:\d+)", line):
                self.base = match.group(1)
                self.ready.set()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base}/v1", api_key=API_KEY, max_retries=0, timeout=60
        )

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


@pytest.fixture(scope="module", params=[(), ("--ohttp",)], ids=["tls", "ohttp"])
def proxied(request):
    with tempfile.TemporaryDirectory() as workdir:
        server = RunningServer(Path(workdir))
        proxy = RunningProxy(server.port, request.param)
        yield server, proxy
        proxy.stop()
        server.stop()


@pytest.fixture(scope="module")
def model(proxied):
    _, proxy = proxied
    models = proxy.client().models.list().data
    assert len(models) == 1
    return models[0]


def test_chat_through_the_proxy_names_what_was_verified(proxied, model):
    server, proxy = proxied
    raw = proxy.client().chat.completions.with_raw_response.create(
        model=model.id,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        temperature=0,
    )
    assert re.fullmatch(r"[0-9a-f]{96}", raw.headers["inferno-verified-measurement"])
    # The verified model digest is the one the server publishes for its model.
    assert raw.headers["inferno-verified-model"] == model.model_extra["digest"]
    response = raw.parse()
    assert response.object == "chat.completion"
    assert response.choices[0].message.content
    # The same request straight to the server gives the same answer.
    direct = server.client().chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        temperature=0,
    )
    assert response.choices[0].message.content == direct.choices[0].message.content


def test_chat_stream_through_the_proxy(proxied, model):
    _, proxy = proxied
    client = proxy.client()
    request = dict(
        model=model.id,
        messages=[{"role": "user", "content": "What is confidential computing?"}],
        max_tokens=16,
        temperature=0,
    )
    whole = client.chat.completions.create(**request).choices[0].message.content
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert len([c for c in chunks if c.choices]) > 1, "the stream arrived as one chunk"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole


def test_completions_through_the_proxy(proxied, model):
    _, proxy = proxied
    client = proxy.client()
    whole = client.completions.create(
        model=model.id, prompt="Confidential computing", max_tokens=10, temperature=0
    )
    assert whole.object == "text_completion"
    streamed = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(
            model=model.id,
            prompt="Confidential computing",
            max_tokens=10,
            temperature=0,
            stream=True,
        )
        if chunk.choices
    )
    assert streamed == whole.choices[0].text


def test_errors_pass_through_the_proxy(proxied, model):
    _, proxy = proxied
    with pytest.raises(openai.NotFoundError) as not_found:
        proxy.client().chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert not_found.value.code == "model_not_found"
    wrong_key = openai.OpenAI(base_url=f"{proxy.base}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong_key.models.list()


def test_tool_call_through_the_proxy(proxied, model):
    _, proxy = proxied
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    response = proxy.client().chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
    )
    calls = response.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)
