"""Tool calls on a bundle whose tokenizer has tool-call tokens (the `tool_bundle` fixture): a
forced call comes back as OpenAI's `tool_calls`, never as text."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.serve.conftest import Server

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "today's weather",
            "parameters": PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server(tool_bundle):
    with Server(tool_bundle) as server:
        yield server


def test_forced_tool_call_comes_back_as_tool_calls(tool_server):
    client = tool_server.client()
    choice = {"type": "function", "function": {"name": "get_weather"}}
    reply = client.chat.completions.create(
        model="tools", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=60, temperature=0
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    [call] = message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)
    without_tools = client.chat.completions.create(model="tools", messages=ASK, max_tokens=1)
    assert reply.usage.prompt_tokens > without_tools.usage.prompt_tokens  # tools in the prompt


def test_required_tool_call_streams_as_a_tool_call_delta(tool_server):
    stream = tool_server.client().chat.completions.create(
        model="tools",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    chunks = [chunk.choices[0] for chunk in stream]
    calls = [call for chunk in chunks for call in chunk.delta.tool_calls or []]
    assert [call.index for call in calls] == [0]
    assert calls[0].function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    assert not "".join(chunk.delta.content or "" for chunk in chunks).strip()
    assert chunks[-1].finish_reason == "tool_calls"


def test_a_conversation_with_an_earlier_call_is_rendered(tool_server):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    reply = tool_server.client().chat.completions.create(
        model="tools", messages=history, tools=TOOLS, tool_choice="none", max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert reply.choices[0].message.tool_calls is None
