"""The server's pieces without a server: request checks, reply assembly (stop strings, tool
calls), prompt budgets, guidance, the command line's refusals."""

from __future__ import annotations

import json
import socket

import pytest

from mobius_genai.cli import main
from mobius_genai.serve.output import Output
from mobius_genai.serve.prompt import PromptRules, reply_budget
from mobius_genai.serve.protocol import (
    Generation,
    RequestError,
    ToolChoice,
    chat_request,
    completion_request,
    parse_body,
)
from mobius_genai.serve.server import Limits, _say_where
from mobius_genai.serve.tools import ToolTokens, guidance, read_call, tool_tokens

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def test_chat_request_reads_openai_fields():
    generation = chat_request(
        {
            **CHAT,
            "model": "m",
            "max_completion_tokens": 7,
            "max_tokens": 99,
            "temperature": 0,
            "stop": "END",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "someone",
            "frequency_penalty": 0,
        }
    )
    assert generation.max_tokens == 7  # the newer name wins
    assert generation.stop == ("END",)
    assert generation.sampling.do_sample is False and generation.sampling.seed == 3
    assert generation.stream and generation.include_usage
    assert generation.messages == ({"role": "user", "content": "Hi"},)
    assert generation.tool_choice == ToolChoice("none")


def test_messages_are_rendered_for_templates():
    generation = chat_request(
        {
            "messages": [
                {
                    "role": "developer",
                    "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief"}],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "2"},
            ]
        }
    )
    system, assistant, tool = generation.messages
    assert system == {"role": "system", "content": "Be brief"}
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert tool == {"role": "tool", "content": "2", "tool_call_id": "c"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "Hi"}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].image_url",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "video_url"}]}]},
            "messages[0].content[0]",
        ),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"),
        ({**CHAT, "top_p": 0}, "top_p"),
        ({**CHAT, "temperature": float("nan")}, "temperature"),
        ({**CHAT, "seed": -1}, "seed"),
        ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({**CHAT, "stop": [""]}, "stop"),
        ({**CHAT, "logprobs": True}, "logprobs"),
        ({**CHAT, "presence_penalty": 0.5}, "presence_penalty"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "response_format": {"type": "xml"}}, "response_format"),
        ({**CHAT, "tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({**CHAT, "tool_choice": "always"}, "tool_choice"),
        ({**CHAT, "functions": []}, "functions"),
    ],
)
def test_bad_chat_fields_are_named(body, param):
    with pytest.raises(RequestError) as refused:
        chat_request(body)
    assert refused.value.status == 400 and refused.value.param == param


def test_completion_request_defaults_and_refusals():
    generation = completion_request({"prompt": ["Once"], "temperature": None})
    assert generation.prompt == "Once" and generation.max_tokens == 16
    assert generation.sampling.do_sample is None  # null: the bundle's own settings
    for body in ({}, {"prompt": 3}, {"prompt": "x", "echo": True}, {"prompt": "x", "suffix": "y"}):
        with pytest.raises(RequestError):
            completion_request(body)


@pytest.mark.parametrize("raw", [b"{", b"[]", b"\xff", b'"text"', b"[" * 100_000])
def test_body_must_be_a_json_object(raw):
    with pytest.raises(RequestError, match="JSON"):
        parse_body(raw)


def _assembled(pieces: list[str], stops=(), tokens=None, ids=None) -> tuple[list[str], Output]:
    output = Output(stops, tokens)
    ids = ids or [10] * len(pieces)
    sent = [output.add(token, piece).text for token, piece in zip(ids, pieces, strict=True)]
    sent.append(output.finish().text)
    return sent, output


def test_stop_string_across_pieces_is_cut_and_held_back():
    sent, output = _assembled(["Hello wo", "rld, E", "N", "D and more", "never"], stops=["END"])
    assert sent == ["Hello wo", "rld, ", "", "", "", ""]  # "E", "EN" held until decided
    assert output.text == "Hello world, " and output.stopped


def test_held_text_that_was_no_stop_string_is_sent():
    sent, output = _assembled(["a <", "/b"], stops=["</s>"])
    assert "".join(sent) == "a </b" and sent[0] == "a " and not output.stopped
    sent, output = _assembled(["tail <"], stops=["</s>"])
    assert sent == ["tail ", "<"]  # flushed at the end


def test_tool_calls_are_taken_out_of_the_text():
    tokens = ToolTokens(begin=1, end=2)
    pieces = ["Sure. ", "<tool_call>", '{"name": "f", ', '"arguments": {"x": 1}}', "</tool_call>"]
    sent, output = _assembled(pieces, tokens=tokens, ids=[10, 1, 10, 10, 2])
    assert "".join(sent) == "Sure. "
    [call] = output.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("f", {"x": 1})
    assert call.id.startswith("call_")
    broken, output = _assembled(
        ["<tool_call>", "not json", "</tool_call>"], tokens=tokens, ids=[1, 10, 2]
    )
    assert "".join(broken) == "not json" and output.tool_calls == []
    unclosed, _ = _assembled(["<tool_call>", '{"name": "f"'], tokens=tokens, ids=[1, 10])
    assert "".join(unclosed) == '{"name": "f"'


def test_read_call_accepts_string_or_object_arguments():
    assert read_call('{"name": "f", "arguments": "{}"}').arguments == "{}"
    assert read_call('{"name": "f", "parameters": {"a": 2}}').arguments == '{"a": 2}'
    assert read_call('{"arguments": {}}') is None
    assert read_call("[1]") is None


def test_tool_tokens_come_from_genai_config():
    config = {"model": {"vocab_size": 100, "bot_token_id": 5, "eot_token_id": 6}}
    assert tool_tokens(config) == ToolTokens(5, 6)
    assert tool_tokens({"model": {"vocab_size": 100, "bot_token_id": 5}}) is None
    assert (
        tool_tokens({"model": {"vocab_size": 100, "bot_token_id": 5, "eot_token_id": 151658}})
        is None
    )


def test_guidance_of_response_format_and_forced_calls():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    kind, data = guidance(Generation(response_format=schema), None)
    assert kind == "json_schema"
    assert json.loads(data) == {"x-guidance": {"whitespace_flexible": False}, **schema}
    tools = ({"type": "function", "function": {"name": "f", "parameters": schema}},)
    forced = Generation(tools=tools, tool_choice=ToolChoice("required", "f"))
    kind, grammar = guidance(forced, ToolTokens(7, 8))
    assert kind == "lark_grammar" and grammar.startswith("start: <[7]> call <[8]>\ncall: %json ")
    assert json.loads(grammar.split("%json ", 1)[1])["properties"]["name"] == {"const": "f"}
    assert (
        guidance(Generation(tools=tools, tool_choice=ToolChoice("auto")), ToolTokens(7, 8)) is None
    )
    for refused in (
        (Generation(tools=tools), None),  # the bundle has no tool-call tokens
        (Generation(tools=tools, tool_choice=ToolChoice("required", "g")), ToolTokens(7, 8)),
        (Generation(tool_choice=ToolChoice("required")), ToolTokens(7, 8)),
        (
            Generation(tools=tools, tool_choice=ToolChoice("required"), response_format={}),
            ToolTokens(7, 8),
        ),
    ):
        with pytest.raises(RequestError):
            guidance(*refused)


def test_reply_budget_against_the_context():
    rules = PromptRules(template=None, bos=None, context=100, max_tokens=50)
    assert reply_budget(Generation(), 10, rules) == 50  # unasked: up to the server's limit
    assert reply_budget(Generation(), 80, rules) == 20  # ... or what the context leaves
    assert reply_budget(Generation(max_tokens=5), 95, rules) == 5
    for asked, prompt in ((6, 95), (None, 100), (51, 10)):
        with pytest.raises(RequestError) as refused:
            reply_budget(Generation(max_tokens=asked), prompt, rules)
        assert refused.value.status == 400


def test_other_hosts_get_a_warning(capsys):
    _say_where("b", "b", "0.0.0.0", 8000, Limits(max_batch=8), None)
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0" in err and "anyone who reaches it" in err
    assert "at most 4 requests at once" in err  # --max-batch above what og 0.18 batches
    _say_where("b", "b", "127.0.0.1", 8000, Limits(), None)
    assert "warning" not in capsys.readouterr().err


def test_command_line_refusals_are_one_line(
    tmp_path, chat_bundle, pruned_bundle, capsys, monkeypatch
):
    assert main(["serve", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a bundle" in err
    assert main(["serve", str(pruned_bundle)]) == 1  # found before listening, not per request
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "og.Engine does not run this bundle" in err
    # what the graph does not tell, one token through the Engine finds before serving
    monkeypatch.setattr("mobius_genai.serve.server.engine_support", lambda folder: None)
    assert main(["serve", str(pruned_bundle)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Engine cannot run this bundle (ENGINE_EXECUTION" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["serve", str(chat_bundle), "--port", port]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--port {port}: cannot listen there" in err
