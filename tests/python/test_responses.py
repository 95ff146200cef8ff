"""`POST /v1/responses` through the real `openai` package: `client.responses.create` with a
function tool (whole and streamed, and the tool loop with `function_call_output`),
`client.responses.parse` with a Pydantic model, and the refusals of server-side state.

The server is the embedded tiny model (random weights): its output is garbage unless a grammar
holds it, so the tests force tool calls and schemas and check their shape.
"""

import json
import tempfile
from pathlib import Path
from typing import Annotated, Literal

import openai
import pydantic
import pytest

from test_openai_client import API_KEY, RunningServer


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as workdir:
        running = RunningServer(Path(workdir))
        yield running
        running.stop()
        assert running.process.returncode == 0, "".join(running.log)


@pytest.fixture(scope="module")
def model_id(server):
    return server.client().models.list().data[0].id


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    unit: Literal["c", "f"]


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 8},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


def _forced_call(client, model_id, **extra):
    return client.responses.create(
        model=model_id,
        instructions="You call tools.",
        input="Weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=120,
        temperature=1.0,
        store=False,
        **extra,
    )


def test_create_with_a_function_tool(server, model_id):
    response = _forced_call(server.client(), model_id)
    assert response.object == "response"
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    assert response.instructions == "You call tools."
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather"
    assert call.call_id.startswith("call_")
    GetWeather.model_validate_json(call.arguments)
    assert response.usage.input_tokens > 0
    assert response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_streamed_function_call_matches_the_events(server, model_id):
    client = server.client()
    events = list(_forced_call(client, model_id, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "response.output_item.added" in kinds
    deltas = "".join(
        event.delta for event in events if event.type == "response.function_call_arguments.delta"
    )
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    assert done.arguments == deltas
    GetWeather.model_validate_json(deltas)
    final = events[-1].response
    call = next(item for item in final.output if item.type == "function_call")
    assert call.arguments == deltas
    assert final.usage.output_tokens > 0

    # The SDK's stream helper accumulates the same events into the final response.
    with client.responses.stream(
        model=model_id,
        input="Weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        # One call, whose bounded arguments end well before the limit (several calls might not).
        parallel_tool_calls=False,
        max_output_tokens=120,
        temperature=1.0,
    ) as stream:
        for _ in stream:
            pass
        accumulated = stream.get_final_response()
    call = next(item for item in accumulated.output if item.type == "function_call")
    GetWeather.model_validate_json(call.arguments)


def test_tool_loop_with_function_call_output(server, model_id):
    """The Responses tool loop: the model's call goes back as input beside its output."""
    client = server.client()
    first = _forced_call(client, model_id)
    call = next(item for item in first.output if item.type == "function_call")
    final = client.responses.create(
        model=model_id,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"},
        ],
        tools=[WEATHER_TOOL],
        max_output_tokens=8,
        temperature=0.0,
    )
    assert final.status in ("completed", "incomplete")
    assert final.usage.input_tokens > first.usage.input_tokens


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    role: Literal["admin", "user", "guest"]
    age: int = pydantic.Field(ge=0, le=120)


def test_parse_with_a_pydantic_model(server, model_id):
    response = server.client().responses.parse(
        model=model_id,
        input="Describe a person.",
        text_format=Person,
        max_output_tokens=120,
        temperature=1.0,
    )
    assert response.status == "completed"
    assert isinstance(response.output_parsed, Person)
    Person.model_validate_json(response.output_text)


def test_streamed_text_reassembles(server, model_id):
    events = list(
        server.client().responses.create(
            model=model_id, input="Hello", max_output_tokens=6, temperature=0.0, stream=True
        )
    )
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    assert final.response.output_text == text
    whole = server.client().responses.create(
        model=model_id, input="Hello", max_output_tokens=6, temperature=0.0
    )
    assert whole.output_text == text


def test_state_is_refused(server, model_id):
    client = server.client()
    for extra in (
        {"previous_response_id": "resp_1"},
        {"store": True},
        {"background": True},
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model=model_id, input="Hi", max_output_tokens=4, **extra)
        assert raised.value.param == next(iter(extra))
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=model_id,
            input="Hi",
            tools=[{"type": "web_search"}],
            max_output_tokens=4,
        )
    assert raised.value.param == "tools[0]"


def test_ignored_fields_are_named(server, model_id):
    raw = server.client().responses.with_raw_response.create(
        model=model_id,
        input="Hi",
        max_output_tokens=4,
        store=False,
        metadata={"run": "1"},
        user="u-1",
    )
    assert raw.parse().metadata == {"run": "1"}
    assert set(raw.headers["inferno-ignored-fields"].split(", ")) == {"store", "metadata", "user"}
    body = json.loads(raw.http_response.text)
    assert body["store"] is False


def test_the_agents_sdk_runs_its_tool_loop(server, model_id):
    """The OpenAI Agents SDK's Responses model: a required call of a function tool, the tool's
    result sent back as `function_call_output`, then (tool choice reset to auto) a final
    answer. The tiny model's answer is noise; the loop's shape is what is checked."""
    import ssl

    import agents

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_weather(
        city: Annotated[str, pydantic.Field(max_length=8)], unit: Literal["c", "f"]
    ) -> str:
        """The weather in a city."""
        calls.append((city, unit))
        return "18 C, sunny"

    context = ssl.create_default_context(cafile=str(server.cert_path))
    client = openai.AsyncOpenAI(
        base_url=f"https://localhost:{server.port}/v1",
        api_key=API_KEY,
        http_client=openai.DefaultAsyncHttpxClient(verify=context, timeout=60),
        max_retries=0,
    )
    agent = agents.Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=model_id, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=400, temperature=0.0),
    )
    result = agents.Runner.run_sync(agent, "Weather in Paris?", max_turns=4)
    assert len(calls) == 1
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    assert len(result.raw_responses) == 2
    assert result.raw_responses[1].usage.input_tokens > result.raw_responses[0].usage.input_tokens
    assert isinstance(result.final_output, str)
