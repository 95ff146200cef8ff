"""Reasoning output through the real `openai` package: the embedded model served with
`--reasoning-parser deepseek_r1`. Its random weights never write `</think>`, so the DeepSeek-R1
split makes the whole output reasoning: the test checks the plumbing end to end (chat
`reasoning_content` whole and streamed, the Responses API's reasoning item and its stream, and
that an enforced tool call, which a grammar holds, is not split).
"""

import tempfile
from pathlib import Path

import pytest

from test_openai_client import RunningServer


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as workdir:
        running = RunningServer(Path(workdir), ("--reasoning-parser", "deepseek_r1"))
        yield running
        running.stop()
        assert running.process.returncode == 0, "".join(running.log)


@pytest.fixture(scope="module")
def model_id(server):
    return server.client().models.list().data[0].id


def _chat(server, model_id, **extra):
    return server.client().chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Think first."}],
        max_tokens=12,
        temperature=0,
        **extra,
    )


def test_the_banner_names_the_reasoning_parser(server):
    assert any("reasoning:   deepseek_r1 (configured)" in line for line in server.log)


def test_chat_reasoning_whole_and_streamed(server, model_id):
    whole = _chat(server, model_id).choices[0].message
    reasoning = whole.model_extra["reasoning_content"]
    assert reasoning
    assert whole.content == ""
    streamed_reasoning, streamed_content = "", ""
    for chunk in _chat(server, model_id, stream=True):
        for choice in chunk.choices:
            streamed_reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            streamed_content += choice.delta.content or ""
    assert streamed_reasoning == reasoning
    assert streamed_content == ""


def test_responses_return_a_reasoning_item(server, model_id):
    client = server.client()
    chat = _chat(server, model_id).choices[0].message.model_extra["reasoning_content"]
    response = client.responses.create(
        model=model_id, input="Think first.", max_output_tokens=12, temperature=0
    )
    reasoning = [item for item in response.output if item.type == "reasoning"]
    assert len(reasoning) == 1
    assert reasoning[0].content[0].text == chat
    events = list(
        client.responses.create(
            model=model_id, input="Think first.", max_output_tokens=12, temperature=0, stream=True
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == chat
    assert events[-1].response.output[0].type == "reasoning"


def test_an_enforced_tool_call_is_not_split(server, model_id):
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string", "maxLength": 8}},
                "required": ["q"],
            },
        },
    }
    message = (
        server.client()
        .chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "Look it up."}],
            tools=[tool],
            tool_choice="required",
            max_tokens=60,
            temperature=1.0,
            seed=3,
        )
        .choices[0]
        .message
    )
    assert message.tool_calls[0].function.name == "lookup"
    assert "reasoning_content" not in (message.model_extra or {})
