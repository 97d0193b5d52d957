"""Bundle tier: package the tiny checkpoint; onnxruntime-genai's greedy tokens equal transformers'."""

from __future__ import annotations

from pathlib import Path

import onnxruntime_genai as og
import pytest

from mobius_genai import packager
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.runtime.generate import greedy_tokens
from tests._hf import hf_greedy_tokens
from tests.conftest import TINY_QWEN2

PROMPT = "The capital of France is"


def _prompt_ids(model: og.Model) -> list[int]:
    return [int(token) for token in og.Tokenizer(model).encode(PROMPT)]


@pytest.mark.parametrize("ep", ["cpu", "default"])
def test_greedy_tokens_equal_transformers(tmp_path: Path, ep: str):
    folder = packager.package(TINY_QWEN2, ep, tmp_path / ep, quiet=True)
    validate_bundle(folder)
    model = og.Model(str(folder))
    prompt = _prompt_ids(model)
    ours = greedy_tokens(model, prompt, len(prompt) + 32)
    assert len(ours) == 32  # no early eos: the comparison covers 32 tokens
    assert ours == hf_greedy_tokens(TINY_QWEN2, prompt, 32)


@pytest.mark.parametrize("ep", ["cpu", "default"])
def test_greedy_tokens_to_the_end_of_the_context_window(tmp_path: Path, ep: str):
    """48 tokens: past the checkpoint's (disabled) 32-token sliding window, up to the limit."""
    folder = packager.package(TINY_QWEN2, ep, tmp_path / ep, context_length=48, quiet=True)
    model = og.Model(str(folder))
    prompt = _prompt_ids(model)
    ours = greedy_tokens(model, prompt, 48)
    assert len(prompt) + len(ours) == 48
    assert ours == hf_greedy_tokens(TINY_QWEN2, prompt, 48 - len(prompt))
