"""Requests in flight: batched together, cancelled when their client leaves, finished before
Ctrl-C ends the server. On a bundle with a context of 2048, so replies last long enough."""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
import urllib.request

import openai
import pytest

from tests.serve.conftest import Server

LONG = 1500
MESSAGES = [{"role": "user", "content": "Tell me a long story"}]


def _health(server) -> dict:
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=30) as answer:
        return json.load(answer)


def _open_stream(server, max_tokens: int = LONG) -> tuple[http.client.HTTPConnection, object]:
    """A streaming chat request, its first event read: the reply is being generated."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    connection.request("POST", "/v1/chat/completions", json.dumps(body))
    answer = connection.getresponse()
    assert answer.status == 200
    assert answer.readline().startswith(b"data: ")
    return connection, answer


def test_concurrent_streams_run_in_one_batch_and_leaving_clients_are_cancelled(long_bundle):
    with Server(long_bundle, "--max-batch", "4", "--max-queue", "4") as server:
        streams = [_open_stream(server) for _ in range(4)]
        # all four generate at once (one Engine batch), none waits behind another
        assert _health(server)["requests"] == {"running": 4, "waiting": 0}
        with pytest.raises(openai.RateLimitError) as refused:  # the queue holds 4
            server.client().chat.completions.create(messages=MESSAGES, model="bundle")
        assert refused.value.code == "queue_full"
        for connection, _ in streams:
            connection.close()
        for _ in streams:
            line = server.wait_for(r"client left .* cancelled after \d+ tokens")
            assert int(re.search(r"after (\d+) tokens", line).group(1)) < LONG
        deadline = time.monotonic() + 30
        while _health(server)["requests"]["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _health(server)["requests"] == {"running": 0, "waiting": 0}
        reply = server.client().chat.completions.create(
            model="bundle", messages=MESSAGES, max_tokens=5
        )  # the places are free again
        assert reply.usage.completion_tokens == 5


def test_ctrl_c_lets_the_reply_in_flight_finish(long_bundle):
    server = Server(long_bundle)
    try:
        stream = server.client().chat.completions.create(
            model="bundle",
            messages=MESSAGES,
            max_tokens=LONG,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [next(stream), next(stream)]
        server.process.send_signal(signal.SIGINT)
        chunks += list(stream)
        assert chunks[-1].usage.completion_tokens == LONG
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert server.process.wait(timeout=60) == 0  # no second signal: it ends by itself
    finally:
        server.stop(signal.SIGKILL)
    assert server.lines[-1] == "mobius-genai: stopped"
    assert any(f"+ {LONG} tokens" in line for line in server.lines)
