"""The real `openai` Python client against a real `inferno serve` over TLS.

The server is the built binary (INFERNO_BIN, default target/debug/inferno) serving the embedded
default model on 127.0.0.1 with an ephemeral port and a self-signed certificate. The test reads
the port and the certificate fingerprint from the startup banner, fetches the certificate over
TLS, checks it against the fingerprint, and trusts exactly that certificate.
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
from typing import Literal

import openai
import pydantic
import pytest

REPO = Path(__file__).resolve().parents[2]
API_KEY = "python-client-test-key"
STARTUP_TIMEOUT_S = 120


def _binary() -> Path:
    path = Path(os.environ.get("INFERNO_BIN", REPO / "target" / "debug" / "inferno"))
    if not path.is_file():
        pytest.fail(f"inferno binary not found at {path}; build it or set INFERNO_BIN")
    return path


class RunningServer:
    """An `inferno serve` subprocess and what a client needs to reach it."""

    def __init__(self, workdir: Path, args: tuple[str, ...] = (), tool_call_parser: str = "hermes"):
        config = workdir / "inferno.toml"
        key_hash = hashlib.sha256(API_KEY.encode()).hexdigest()
        config.write_text(
            '[attestation]\nprofile = "development"\n[server]\nlisten = "127.0.0.1:0"\nshutdown_grace_secs = 5\n'
            # The embedded model's template shows no tool-call markers: name the format.
            f'tool_call_parser = "{tool_call_parser}"\n'
            f'[[auth.keys]]\nname = "python"\nsha256 = "{key_hash}"\n'
        )
        self.process = subprocess.Popen(
            [str(_binary()), "serve", "--config", str(config), "--device", "cpu", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self.ready = threading.Event()
        self.port = None
        self.fingerprint = None
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self.ready.wait(STARTUP_TIMEOUT_S):
            self.stop()
            pytest.fail("server did not become ready:\n" + "".join(self.log))
        self.cert_path = workdir / "server.pem"
        self.cert_path.write_text(self._fetch_certificate())

    def _read_log(self):
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if match := re.search(r"listening:\s+https://127\.0\.0\.1:(\d+)", line):
                self.port = int(match.group(1))
            if match := re.search(r"SHA-256 ([0-9A-F:]{95})", line):
                self.fingerprint = match.group(1)
                self.ready.set()

    def _fetch_certificate(self) -> str:
        pem = ssl.get_server_certificate(("127.0.0.1", self.port))
        der = ssl.PEM_cert_to_DER_cert(pem)
        digest = hashlib.sha256(der).hexdigest().upper()
        observed = ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
        assert observed == self.fingerprint, "certificate does not match the banner"
        return pem

    def client(self, api_key: str = API_KEY) -> openai.OpenAI:
        context = ssl.create_default_context(cafile=str(self.cert_path))
        return openai.OpenAI(
            base_url=f"https://localhost:{self.port}/v1",
            api_key=api_key,
            http_client=openai.DefaultHttpxClient(verify=context, timeout=60),
            max_retries=0,
        )

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as workdir:
        running = RunningServer(Path(workdir))
        yield running
        running.stop()
        assert running.process.returncode == 0, "".join(running.log)


@pytest.fixture(scope="module")
def model_id(server):
    models = server.client().models.list().data
    assert len(models) == 1
    return models[0].id


def test_models_lists_the_served_model(server, model_id):
    listed = server.client().models.list().data[0]
    assert listed.id == model_id
    assert listed.owned_by == "inferno"
    digest = listed.model_extra["digest"]
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    retrieved = server.client().models.retrieve(model_id)
    assert retrieved.id == model_id
    with pytest.raises(openai.NotFoundError):
        server.client().models.retrieve("no-such-model")


def test_chat_completion(server, model_id):
    response = server.client().chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=12,
        temperature=0,
    )
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert response.usage.prompt_tokens > 0
    assert 0 < response.usage.completion_tokens <= 12


def test_chat_stream_matches_whole_response(server, model_id):
    client = server.client()
    request = dict(
        model=model_id,
        messages=[{"role": "user", "content": "What is confidential computing?"}],
        max_tokens=16,
        temperature=0,
    )
    whole = client.chat.completions.create(**request).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(
        chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices
    )
    assert text == whole
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")


def test_completion_and_its_stream(server, model_id):
    client = server.client()
    whole = client.completions.create(
        model=model_id, prompt="Confidential computing", max_tokens=10, temperature=0
    )
    assert whole.object == "text_completion"
    streamed = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(
            model=model_id,
            prompt="Confidential computing",
            max_tokens=10,
            temperature=0,
            stream=True,
        )
        if chunk.choices
    )
    assert streamed == whole.choices[0].text


def test_echo_scores_the_prompt_as_a_loglikelihood_harness_reads_it(server, model_id):
    # lm-evaluation-harness's `local-completions` loglikelihood request: the prompt's tokens come
    # back with their logprobs, the first one None, then one generated token.
    prompt = "Confidential computing protects data in use"
    response = server.client().completions.create(
        model=model_id, prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    choice = response.choices[0]
    assert choice.text.startswith(prompt)
    logprobs = choice.logprobs
    prompt_tokens = response.usage.prompt_tokens
    assert len(logprobs.tokens) == prompt_tokens + 1
    assert logprobs.token_logprobs[0] is None
    assert logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(len(top) == 1 for top in logprobs.top_logprobs[1:])
    # Offsets count in the returned text (a BOS the tokenizer added is no text).
    completion_at = logprobs.text_offset[prompt_tokens]
    assert choice.text[:completion_at] == prompt


def test_n_choices(server, model_id):
    response = server.client().completions.create(
        model=model_id, prompt="Once", max_tokens=4, n=2, seed=3, temperature=1.0
    )
    assert sorted(choice.index for choice in response.choices) == [0, 1]


def test_errors_raise_typed_exceptions(server, model_id):
    client = server.client()
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model_id, messages=[])
    assert bad.value.param == "messages"
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong-key").models.list()


def test_request_id_is_generated_and_the_clients_echoed(server):
    context = ssl.create_default_context(cafile=str(server.cert_path))
    connection = http.client.HTTPSConnection("localhost", server.port, context=context)
    try:
        connection.request("GET", "/health", headers={"X-Request-Id": "py-123"})
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("x-client-request-id") == "py-123"
        assert len(response.getheader("x-request-id")) == 36
    finally:
        connection.close()


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=6)
    zip: int = pydantic.Field(ge=1000, le=99999)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    role: Literal["admin", "user", "guest"]
    age: int = pydantic.Field(ge=0, le=120)
    address: Address


def test_pydantic_response_format(server, model_id):
    # The SDK's structured-output helper sends a strict json_schema and parses the answer back
    # into the model; the tiny model's random weights only get there through the grammar.
    completion = server.client().beta.chat.completions.parse(
        model=model_id,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
        max_tokens=200,
        temperature=1.0,
        seed=7,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Person)
    Person.model_validate_json(message.content)


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    unit: Literal["c", "f"]


def test_required_tool_call_with_pydantic_tool(server, model_id):
    completion = server.client().beta.chat.completions.parse(
        model=model_id,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        max_tokens=120,
        temperature=1.0,
        seed=3,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)


def test_agent_loop_sends_the_call_back_with_content_null(server, model_id):
    """The SDK's standard tool loop: a required call, the assistant's message sent back with
    `content: None` beside the tool's result, then a final answer."""
    client = server.client()
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model=model_id,
        messages=messages,
        tools=tools,
        tool_choice="required",
        max_tokens=120,
        temperature=1.0,
        seed=3,
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    call = message.tool_calls[0]
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call.model_dump()],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"})
    final = client.chat.completions.create(
        model=model_id, messages=messages, tools=tools, max_tokens=16, temperature=0.0
    )
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.usage.prompt_tokens > first.usage.prompt_tokens


def test_fields_that_change_nothing_are_accepted_and_named(server, model_id):
    raw = server.client().chat.completions.with_raw_response.create(
        model=model_id,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        store=False,
        metadata={"run": "1"},
        user="u-1",
        extra_body={"prompt_cache_key": "k", "safety_identifier": "s"},
    )
    assert raw.parse().choices[0].message.content is not None
    named = raw.headers["inferno-ignored-fields"].split(", ")
    assert set(named) == {"store", "metadata", "user", "prompt_cache_key", "safety_identifier"}
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, store=True
        )
    assert raised.value.param == "store"


def test_unsupported_field_names_itself(server, model_id):
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            extra_body={"frobnicate": True},
        )
    assert raised.value.param == "frobnicate"
