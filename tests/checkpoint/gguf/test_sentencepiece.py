"""GGUF SentencePiece vocabularies (tokenizer.ggml.model "llama", no merges) become a
tokenizer.json that encodes and decodes like transformers' tokenizer from the same GGUF, per
architecture (llama's Metaspace, phi3's normalizer, gemma's spaces), and that
onnxruntime-genai loads."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime_genai as og
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

import mobius_genai
from mobius_genai.checkpoint.gguf import GgufCheckpoint
from mobius_genai.checkpoint.gguf.tokenizer import tokenizer_json
from tests.checkpoint.gguf._tiny import write_tiny_gguf

TEXTS = [
    "the cat sat on the mat",
    "hello world",
    "  two  spaces and\nthe mat",
    " the",
    "héllo wörld 42",
]
#: architecture → the tiny family written under it.
FAMILIES = {"llama": "llama", "phi3": "phi3", "gemma3": "gemma3_text"}


def _gguf(tmp_path: Path, arch: str) -> Path:
    return write_tiny_gguf(
        tmp_path / f"{arch}.gguf", FAMILIES[arch], architecture=arch, tokenizer="llama"
    )


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_encodings_equal_transformers(tmp_path: Path, arch: str):
    gguf = _gguf(tmp_path, arch)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name)
    ours = Tokenizer.from_str(json.dumps(tokenizer_json(GgufCheckpoint(gguf).metadata, "x")))
    for text in TEXTS:
        expected = reference.encode(text)
        assert ours.encode(text).ids == expected, (text, ours.encode(text).tokens)
        decoded = reference.decode(expected, skip_special_tokens=True)
        assert ours.decode(expected, skip_special_tokens=True) == decoded, text


def test_onnxruntime_genai_loads_it(tmp_path: Path):
    """onnxruntime-genai's tokenizer splits text as transformers does. It adds no BOS of its
    own here (transformers does, from add_bos_token): chat templates write it. Texts that
    start with a space or hold runs of spaces are left out: onnxruntime-genai splits " the"
    and "  two" otherwise than transformers."""
    gguf = _gguf(tmp_path, "llama")
    bundle = mobius_genai.package(gguf, "cpu", tmp_path / "bundle", smoke_test=False, quiet=True)
    tokenizer = og.Tokenizer(og.Model(str(bundle)))
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name)
    for text in (t for t in TEXTS if "  " not in t and not t.startswith(" ")):
        expected = reference.encode(text, add_special_tokens=False)
        assert list(tokenizer.encode(text)) == expected, text
