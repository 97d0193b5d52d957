"""Requests in flight: batched together, cancelled when their client leaves, finished before
Ctrl-C ends the server. On a bundle with a context of 8192: a reply of LONG tokens takes the
tiny model seconds (its attention grows with the sequence), long enough to be caught in flight."""

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

LONG = 6000
#: A reply that is still being generated when Ctrl-C comes, and short enough to wait for.
DRAIN = 1500
MESSAGES = [{"role": "user", "content": "Tell me a long story"}]


def _health(server) -> dict:
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=30) as answer:
        return json.load(answer)


def _settled(server) -> dict[str, int]:
    """The server's request counts once nothing runs (the engine stops a cancelled turn at its
    next step), or after 30 s."""
    deadline = time.monotonic() + 30
    while _health(server)["requests"]["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    return _health(server)["requests"]


def _send(server, stream: bool = True) -> http.client.HTTPConnection:
    """A chat request of LONG tokens, sent; its answer not read yet."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"messages": MESSAGES, "max_tokens": LONG, "temperature": 0, "stream": stream}
    connection.request("POST", "/v1/chat/completions", json.dumps(body))
    return connection


def _first_content(connection: http.client.HTTPConnection) -> None:
    """Read the stream until its first generated text."""
    answer = connection.getresponse()
    assert answer.status == 200
    for _ in range(100):
        line = answer.readline()
        if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
            "content"
        ):
            return
    pytest.fail("no generated text in the first 100 lines")


def test_concurrent_streams_share_a_batch_and_leaving_clients_are_cancelled(long_bundle):
    # a window long enough for the four requests to meet, whatever the machine's load
    options = ("--max-batch", "4", "--max-queue", "4", "--batch-window-ms", "2000")
    with Server(long_bundle, *options) as server:
        connections = [_send(server) for _ in range(4)]
        for connection in connections:
            _first_content(connection)
        # each reply is under way: in one Engine batch, none waiting behind another's LONG
        # tokens (a static batch takes no one in once it runs)
        assert _health(server)["requests"] == {"running": 4, "waiting": 0}
        with pytest.raises(openai.RateLimitError) as refused:  # the queue holds 4
            server.client().chat.completions.create(messages=MESSAGES, model="bundle")
        assert refused.value.code == "queue_full"
        for connection in connections:
            connection.close()
        for _ in connections:  # cancelled, not run to the end
            line = server.wait_for(r"client left")
            assert re.search(r"cancelled after \d+ tokens", line), line
        assert _settled(server) == {"running": 0, "waiting": 0}
        reply = server.client().chat.completions.create(
            model="bundle", messages=MESSAGES, max_tokens=5
        )  # the places are free again
        assert reply.usage.completion_tokens == 5


def test_a_client_leaving_before_its_whole_reply_cancels_it(long_bundle):
    with Server(long_bundle, "--batch-window-ms", "0") as server:
        connection = _send(server, stream=False)
        deadline = time.monotonic() + 30
        while _health(server)["requests"]["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _health(server)["requests"]["running"] == 1  # being generated
        connection.close()
        line = server.wait_for(r"client left")
        assert re.search(r"cancelled after \d+ tokens", line), line
        assert _settled(server) == {"running": 0, "waiting": 0}


def test_ctrl_c_lets_the_reply_in_flight_finish(long_bundle):
    server = Server(long_bundle)
    try:
        stream = server.client().chat.completions.create(
            model="bundle",
            messages=MESSAGES,
            max_tokens=DRAIN,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [next(stream), next(stream)]
        server.process.send_signal(signal.SIGINT)
        chunks += list(stream)
        assert chunks[-1].usage.completion_tokens == DRAIN
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert server.process.wait(timeout=60) == 0  # no second signal: it ends by itself
    finally:
        server.stop(signal.SIGKILL)
    assert server.lines[-1] == "mobius-genai: stopped"
    assert any(f"+ {DRAIN} tokens" in line for line in server.lines)
