"""The `<bos>` a checkpoint's tokenizer asks for (tokenizer_config's add_bos_token + bos_token,
as Gemma's) starts every prompt `run` and the smoke test feed, exactly once, as transformers'
tokenizer encodes it; onnxruntime-genai's tokenizer does not add it itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnxruntime_genai as og
import pytest
from transformers import AutoTokenizer

from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.runtime import _smoke_child
from tests._hf import write_tiny_checkpoint
from tests.conftest import TINY_QWEN2

BOS = "<|endoftext|>"  # id 381 in the committed tiny tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def _gemma_like_tokenizer(folder: Path, template_starts_with_bos: bool) -> None:
    """The tiny tokenizer made to add a bos the way Gemma's does: tokenizer_config asks for it
    and tokenizer.json's post-processor adds it (which transformers follows)."""
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_QWEN2 / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(add_bos_token=True, bos_token=BOS)
    if template_starts_with_bos:
        config["chat_template"] = "{{ bos_token }}" + config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            bos,
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {BOS: {"id": BOS, "ids": [381], "tokens": [BOS]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))


@pytest.fixture(scope="module", params=[False, True], ids=["template", "template-with-bos"])
def gemma_bundle(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bos")
    ckpt = write_tiny_checkpoint(
        root / "ckpt", "gemma3_text", seed=3, vocab_size=384, bos_token_id=381, eos_token_id=383
    )
    _gemma_like_tokenizer(ckpt, template_starts_with_bos=request.param)
    out = root / "bundle"
    assert main(["package", str(ckpt), "--ep", "cpu", "-o", str(out), "--quiet"]) == 0
    return ckpt, out


@pytest.fixture
def fed(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The token ids every onnxruntime-genai generator, and every og.Engine turn, is given."""
    calls: list[list[int]] = []
    real = og.Generator
    begin_turn = og.Request.begin_turn

    def recorded_turn(request, tokens, options=None):
        calls.append([int(token) for token in tokens])
        return begin_turn(request, tokens, options)

    monkeypatch.setattr(og.Request, "begin_turn", recorded_turn)

    class Recording:
        def __init__(self, model, params):
            self._generator = real(model, params)

        def append_tokens(self, tokens):
            calls.append([int(token) for token in tokens])
            self._generator.append_tokens(tokens)

        def __getattr__(self, name):
            return getattr(self._generator, name)

    monkeypatch.setattr(og, "Generator", Recording)
    return calls


def test_run_raw_feeds_the_bos_once_like_transformers(gemma_bundle, fed, capsys):
    ckpt, bundle = gemma_bundle
    prompt = "The capital of France is"
    assert main(["run", str(bundle), "--raw", "--prompt", prompt, "--max-new-tokens", "2"]) == 0
    expected = AutoTokenizer.from_pretrained(ckpt)(prompt).input_ids
    assert expected[0] == 381 and expected[1] != 381
    assert fed == [expected]


def test_run_with_the_chat_template_feeds_the_bos_once(gemma_bundle, fed, capsys):
    ckpt, bundle = gemma_bundle
    assert main(["run", str(bundle), "--prompt", "hi", "--max-new-tokens", "2"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    expected = tokenizer(text, add_special_tokens=not text.startswith(BOS)).input_ids
    assert fed[0][:2] == [381, expected[1]] and fed[0].count(381) == 1
    assert fed == [expected]


def test_the_smoke_test_feeds_the_bos_once_like_transformers(gemma_bundle, fed):
    ckpt, bundle = gemma_bundle
    _smoke_child.run_smoke(
        bundle, "cpu", None, {}, max_new_tokens=2, cpu_provider=get_ep("cpu").runtime.ort_provider
    )
    assert fed == [AutoTokenizer.from_pretrained(ckpt)(_smoke_child.SMOKE_PROMPT).input_ids]


def test_the_card_says_how_to_encode(gemma_bundle):
    card = (gemma_bundle[1] / "README.md").read_text()
    assert "[381, *tokenizer.encode(" in card and "add_bos_token" in card
