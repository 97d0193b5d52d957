"""`mobius-genai serve` answered by the official `openai` client: replies equal what
onnxruntime-genai's own Generator makes of the same prompt (rendered here by transformers from
the bundle's chat template), streamed or not, batched or one at a time."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import onnxruntime_genai as og
import pytest
from transformers import AutoTokenizer

PROMPTS = ("Hello there", "What is the capital of France?", "Count: one, two", "def add(a, b):")


def _templated(folder: Path, messages: list[dict[str, str]]) -> str:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _og_reply(folder: Path, text: str, max_tokens: int, **search: object) -> tuple[str, int, int]:
    """(reply text, prompt tokens, reply tokens) of og.Generator for `text` as it is: greedy
    unless `search` says otherwise, end-of-sequence neither shown nor counted."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode(text)
    params = og.GeneratorParams(model)
    params.set_search_options(**{"do_sample": False, **search}, max_length=len(ids) + max_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    stream, pieces, eos = tokenizer.create_stream(), [], set(tokenizer.eos_token_ids)
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if token in eos:
            break
        pieces.append(stream.decode(token))
    return "".join(pieces), len(ids), len(pieces)


def _chat_reference(folder: Path, prompt: str, max_tokens: int, **search: object):
    return _og_reply(
        folder, _templated(folder, [{"role": "user", "content": prompt}]), max_tokens, **search
    )


def test_concurrent_greedy_chats_equal_the_generator(server, chat_bundle):
    client = server.client()

    def ask(prompt: str):
        return client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=12,
            temperature=0,
        )

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        replies = list(pool.map(ask, PROMPTS))
    for prompt, reply in zip(PROMPTS, replies, strict=True):
        text, prompt_tokens, tokens = _chat_reference(chat_bundle, prompt, 12)
        assert reply.choices[0].message.content == text
        assert reply.choices[0].finish_reason == ("length" if tokens == 12 else "stop")
        assert reply.usage.prompt_tokens == prompt_tokens
        assert reply.usage.completion_tokens == tokens
        assert reply.usage.total_tokens == prompt_tokens + tokens
        assert reply.model == "tiny" and reply.object == "chat.completion"


def test_streaming_gives_the_same_text(server, chat_bundle):
    client = server.client()
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPTS[1]}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text, prompt_tokens, tokens = _chat_reference(chat_bundle, PROMPTS[1], 20)
    pieces = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    assert "".join(pieces) == text
    assert len(pieces) > 2  # streamed in pieces, not as one
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens == 20
    assert chunks[-1].usage.prompt_tokens == prompt_tokens


def test_raw_completion_equals_the_generator(server, chat_bundle):
    client = server.client()
    reply = client.completions.create(model="tiny", prompt="Once upon a time", temperature=0)
    text, prompt_tokens, tokens = _og_reply(chat_bundle, "Once upon a time", 16)  # OpenAI's default
    assert reply.choices[0].text == text
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_tokens, tokens)
    streamed = client.completions.create(
        model="tiny", prompt="Once upon a time", temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == text


def test_stop_string_cuts_the_reply(server, chat_bundle):
    text, _, _ = _chat_reference(chat_bundle, PROMPTS[0], 30)
    stop = text[5:8]  # a stop string that greedy decoding meets after a few tokens
    expected = text[: text.index(stop)]
    client = server.client()
    for stream in (False, True):
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": PROMPTS[0]}],
            max_tokens=30,
            temperature=0,
            stop=[stop, "never in the text"],
            stream=stream,
        )
        if stream:
            chunks = [chunk.choices[0] for chunk in reply]
            assert "".join(c.delta.content or "" for c in chunks) == expected
            assert chunks[-1].finish_reason == "stop"
        else:
            assert reply.choices[0].message.content == expected
            assert reply.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_the_generators_and_reproducible(server, chat_bundle):
    client = server.client()

    def sample(seed: int) -> str:
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": PROMPTS[2]}],
            max_tokens=16,
            temperature=1.5,
            seed=seed,
        )
        return reply.choices[0].message.content

    expected, _, _ = _chat_reference(
        chat_bundle, PROMPTS[2], 16, do_sample=True, temperature=1.5, random_seed=7
    )
    assert sample(7) == sample(7) == expected
    assert sample(8) != expected


def test_json_schema_output_parses_and_validates(server):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
            "sunny": {"type": "boolean"},
            "days": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["city", "sunny", "days"],
        "additionalProperties": False,
    }
    client = server.client()
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "The weather, as JSON"}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    document = json.loads(reply.choices[0].message.content)
    jsonschema.validate(document, schema)
    assert reply.choices[0].finish_reason == "stop"
    unguided = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "The weather, as JSON"}],
        max_tokens=60,
        temperature=0,
    )
    with pytest.raises(ValueError):  # the random model writes no JSON of its own
        json.loads(unguided.choices[0].message.content)
    anything = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Any JSON object"}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)
    else:  # cut by max_tokens: a JSON object still being written
        assert anything.choices[0].message.content.startswith("{")


def test_models_and_health(server):
    client = server.client()
    assert [model.id for model in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=30) as answer:
        health = json.load(answer)
    assert health["status"] == "ok" and health["requests"] == {"running": 0, "waiting": 0}
