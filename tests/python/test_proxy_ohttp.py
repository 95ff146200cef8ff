"""The real `openai` Python client, unmodified, through `inferno proxy --ohttp`.

The proxy fetches the server's Oblivious HTTP key configuration, asks for fresh evidence with a
nonce sealed to it, checks that the evidence names that key (policy/client-development.toml:
the simulated TEE), and then seals every request to it (RFC 9458; streamed answers in chunked
OHTTP). The client speaks plain HTTP to the proxy and knows nothing of any of it.
"""

import json
import re
import tempfile
from pathlib import Path

import pytest

from test_openai_client import RunningServer
from test_proxy import RunningProxy


@pytest.fixture(scope="module")
def sealed():
    with tempfile.TemporaryDirectory() as workdir:
        server = RunningServer(Path(workdir))
        proxy = RunningProxy(server.port, ("--ohttp",))
        yield server, proxy
        proxy.stop()
        server.stop()


@pytest.fixture(scope="module")
def model(sealed):
    _, proxy = sealed
    models = proxy.client().models.list().data
    assert len(models) == 1
    return models[0]


def test_chat_is_sealed_and_names_what_was_verified(sealed, model):
    server, proxy = sealed
    request = dict(
        model=model.id,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        temperature=0,
    )
    raw = proxy.client().chat.completions.with_raw_response.create(**request)
    assert re.fullmatch(r"[0-9a-f]{96}", raw.headers["inferno-verified-measurement"])
    assert raw.headers["inferno-verified-model"] == model.model_extra["digest"]
    response = raw.parse()
    assert response.choices[0].message.content
    # The same answer as straight over attested TLS.
    direct = server.client().chat.completions.create(**request)
    assert response.choices[0].message.content == direct.choices[0].message.content


def test_chat_stream_arrives_in_chunks(sealed, model):
    _, proxy = sealed
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


def test_tool_call_is_sealed(sealed, model):
    _, proxy = sealed
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


def test_errors_come_back_sealed(sealed, model):
    import openai

    _, proxy = sealed
    with pytest.raises(openai.NotFoundError) as not_found:
        proxy.client().chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert not_found.value.code == "model_not_found"
