"""`serve --adapter NAME`: each adapter is a model of its own beside the base, answered by the
official `openai` client with the tokens transformers' PEFT model generates with that adapter
(og.Engine has no adapters in 0.18, so these requests run on og.Generator lanes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnxruntime_genai as og
import openai
import pytest

from tests.adapters.conftest import peft_greedy
from tests.serve.conftest import Server

PROMPT = "Once upon a time"
TOKENS = 10


def _text(folder: Path, ids: list[int]) -> str:
    """`ids` as the server streams them: decoded one by one, end-of-sequence left out."""
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    stream, eos = tokenizer.create_stream(), set(tokenizer.eos_token_ids)
    return "".join(stream.decode(token) for token in ids if token not in eos)


@pytest.fixture(scope="module")
def served(lora_bundles):
    base, bundle = lora_bundles("qwen2")
    with Server(bundle, "--model-name", "base", "--adapter", "r4", "--adapter", "r8") as server:
        yield base, bundle, server


def test_each_adapter_is_a_model_answering_with_peft_tokens(served):
    base, bundle, server = served
    client = server.client()
    assert [model.id for model in client.models.list()] == ["base", "r4", "r8"]
    assert client.models.retrieve("r8").id == "r8"
    ids = og.Tokenizer(og.Model(str(bundle))).encode(PROMPT).tolist()

    def ask(name: str) -> str:
        reply = client.completions.create(
            model=name, prompt=PROMPT, max_tokens=TOKENS, temperature=0
        )
        assert reply.model == name
        return reply.choices[0].text

    names = ["base", "r4", "r8", "r4"]  # at once: the Engine's and the adapters' lanes together
    with ThreadPoolExecutor(len(names)) as pool:
        replies = list(pool.map(ask, names))
    expected = {
        name: _text(bundle, peft_greedy(base.checkpoint, base.adapters.get(name), ids, TOKENS))
        for name in ("base", "r4", "r8")
    }
    assert len(set(expected.values())) == 3  # the adapters change the reply: the check can fail
    assert replies == [expected[name] for name in names]


def test_adapter_reply_streams_the_same_text(served):
    base, bundle, server = served
    ids = og.Tokenizer(og.Model(str(bundle))).encode(PROMPT).tolist()
    stream = server.client().completions.create(
        model="r8", prompt=PROMPT, max_tokens=TOKENS, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in stream)
    assert text == _text(bundle, peft_greedy(base.checkpoint, base.adapters["r8"], ids, TOKENS))


def test_unknown_model_names_every_accepted_one(served):
    _, _, server = served
    with pytest.raises(openai.NotFoundError) as refused:
        server.client().completions.create(model="r16", prompt=PROMPT, max_tokens=2)
    message = refused.value.body["message"]
    assert "'r16'" in message and "'base', 'r4', 'r8'" in message


def test_an_adapter_the_bundle_lacks_is_refused_at_start(lora_bundles, tmp_path):
    _, bundle = lora_bundles("qwen2")
    with pytest.raises(pytest.fail.Exception) as ended:
        Server(bundle, "--adapter", "r16")
    assert "no adapter 'r16'" in str(ended.value) and "'r4', 'r8'" in str(ended.value)


def test_an_adapter_under_the_base_name_is_refused(lora_bundles):
    _, bundle = lora_bundles("qwen2")
    with pytest.raises(pytest.fail.Exception) as ended:
        Server(bundle, "--model-name", "r4", "--adapter", "r4")
    assert "--adapter 'r4' has the name the base model is served under" in str(ended.value)
