"""Tool-call and reasoning token ids in genai_config.json (bot/eot/bor/eor_token_id): written
from the tokenizer's whole vocabulary as onnxruntime-genai's builder writes them, loaded by
og.Model, and checked against the tokenizer by validate."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime_genai as og
import pytest
from transformers import AutoTokenizer

from mobius_genai import packager
from mobius_genai.bundle.tool_tokens import TOOL_TOKENS, tool_token_ids, vocabulary
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.errors import BundleError
from tests._hf import write_tiny_checkpoint
from tests.conftest import TINY_QWEN2

PLAIN = ["<tool_call>", "</tool_call>"]  # plain added tokens: the builder reads them too
SPECIAL = ["<think>", "</think>"]


@pytest.fixture(scope="module")
def tool_bundle(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """A tiny qwen2 whose tokenizer has the four tokens, packaged for cpu; and the ids
    transformers' get_vocab() (what the builder reads) gives them."""
    ckpt = tmp_path_factory.mktemp("tools") / "ckpt"
    tokenizer = AutoTokenizer.from_pretrained(TINY_QWEN2)
    tokenizer.add_tokens(PLAIN)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    write_tiny_checkpoint(
        ckpt, "qwen2", vocab_size=len(tokenizer), bos_token_id=381, eos_token_id=383
    )
    tokenizer.save_pretrained(ckpt)
    vocab = tokenizer.get_vocab()
    expected = {key: vocab[spellings[0]] for key, spellings in TOOL_TOKENS.items()}
    out = tmp_path_factory.mktemp("tools") / "bundle"
    return packager.package(ckpt, "cpu", out, quiet=True, smoke_test=False), expected


def test_ids_written_as_the_builder_writes_them_and_og_loads_them(tool_bundle):
    folder, expected = tool_bundle
    model_section = json.loads((folder / "genai_config.json").read_text())["model"]
    assert {key: model_section.get(key) for key in TOOL_TOKENS} == expected
    assert len(set(expected.values())) == 4
    model = og.Model(str(folder))  # og's strict parser accepts the keys
    tokenizer = og.Tokenizer(model)
    assert [int(t) for t in tokenizer.encode("<tool_call>")] == [expected["bot_token_id"]]
    validate_bundle(folder)


def test_validate_refuses_an_id_the_tokenizer_does_not_give(tool_bundle, tmp_path):
    folder, expected = tool_bundle
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    config = json.loads((copy / "genai_config.json").read_text())
    config["model"]["eor_token_id"] = expected["bor_token_id"]
    (copy / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(BundleError, match=r"model\.eor_token_id: \d+ is not the tokenizer's id"):
        validate_bundle(copy, check_hashes=False)


def test_no_ids_without_the_tokens(packaged):
    folder = packaged("cpu")
    assert tool_token_ids(folder) == {}
    model_section = json.loads((folder / "genai_config.json").read_text())["model"]
    assert not set(TOOL_TOKENS) & set(model_section)


def test_vocabulary_reads_unigram_lists_and_the_second_spelling(tmp_path):
    document = {
        "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["<|tool_call|>", -1.0]]},
        "added_tokens": [{"id": 2, "content": "<|/tool_call|>"}],
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(document))
    assert vocabulary(tmp_path) == {"<unk>": 0, "<|tool_call|>": 1, "<|/tool_call|>": 2}
    assert tool_token_ids(tmp_path) == {"bot_token_id": 1, "eot_token_id": 2}
