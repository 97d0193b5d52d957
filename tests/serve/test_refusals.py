"""Bad requests get OpenAI-shaped 4xx errors and never take the server down; the API key."""

from __future__ import annotations

import http.client
import json

import openai
import psutil
import pytest

from tests.serve.conftest import Server

GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
_BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}


def _post(server, path: str, body: bytes, headers: dict[str, str] | None = None):
    """(status, parsed JSON body) of a raw POST: bodies the openai client would not send."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request(
            "POST", path, body, {"Content-Type": "application/json", **(headers or {})}
        )
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def _good_request_works(server) -> None:
    reply = server.client().chat.completions.create(**GOOD)
    assert reply.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "tiny", "max_tokens": 3}, 400, "messages"),
        ({**GOOD, "max_tokens": -1}, 400, "max_tokens"),
        ({**GOOD, "model": "gpt-4o"}, 404, "model"),
        ({**GOOD, "messages": [{"role": "user", "content": "cat " * 200}]}, 400, "messages"),
        ({**GOOD, "max_tokens": 120}, 400, "messages"),  # prompt + reply above the context
        ({**GOOD, "max_tokens": 1000}, 400, "max_tokens"),  # above the server's limit
        ({**GOOD, "n": 2}, 400, "n"),
        ({**GOOD, "temperature": 3}, 400, "temperature"),
        ({**GOOD, "messages": [{"role": "robot", "content": "Hi"}]}, 400, "messages[0]"),
        ({**GOOD, "unknown_option": True}, 400, "unknown_option"),
        ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
        ({**GOOD, "response_format": _BAD_SCHEMA}, 400, None),  # llguidance refuses it
        ({**GOOD, "response_format": _BAD_SCHEMA, "seed": 1, "temperature": 1}, 400, None),
    ],
)
def test_bad_request_is_refused_and_the_next_one_works(server, body, status, param):
    with pytest.raises(openai.APIStatusError) as refused:
        server.client().post("/chat/completions", body=body, cast_to=object)
    assert refused.value.status_code == status
    error = refused.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    _good_request_works(server)


def test_over_long_prompt_names_the_context(server):
    with pytest.raises(openai.BadRequestError) as refused:
        server.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "dog " * 200}]
        )
    assert refused.value.code == "context_length_exceeded"
    assert "maximum context length is 128 tokens" in refused.value.message
    _good_request_works(server)


def test_malformed_json_and_huge_body_get_4xx(server):
    status, body = _post(server, "/v1/chat/completions", b'{"model": "tiny", "messages": [')
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    _good_request_works(server)
    huge = json.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * (10 << 20)}]})
    status, body = _post(server, "/v1/chat/completions", huge.encode())
    assert status == 413 and body["error"]["code"] == "request_too_large"
    _good_request_works(server)
    status, body = _post(server, "/v1/chat/completions", b"[1, 2]")
    assert status == 400
    status, body = _post(server, "/v1/nowhere", b"{}")
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    _good_request_works(server)


def test_listens_on_loopback_only_by_default(server):
    listening = [
        connection.laddr
        for connection in psutil.Process(server.process.pid).net_connections(kind="inet")
        if connection.status == psutil.CONN_LISTEN
    ]
    assert listening == [("127.0.0.1", server.port)]
    assert server.url == f"http://127.0.0.1:{server.port}/v1"


def test_api_key_is_required_when_set(chat_bundle):
    with Server(chat_bundle, "--api-key", "s3cret", "--quiet") as server:
        with pytest.raises(openai.AuthenticationError) as refused:
            server.client().chat.completions.create(**GOOD)
        assert refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="s3cret-not").models.list()
        reply = server.client(api_key="s3cret").chat.completions.create(**GOOD)
        assert reply.usage.completion_tokens == 3
        assert not any("/v1/" in line for line in server.lines)  # --quiet: no request lines
