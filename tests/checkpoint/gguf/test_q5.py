"""GGUF Q5_1 and Q5_K matrices kept as stored: 8-bit MatMulNBits of their 5-bit integers in
blocks of 32, their float offsets as integer zero points plus block mins
(quantize/stored_weights.py), as Q4_1 and Q4_K's are.

Two tiny GGUFs (tests/checkpoint/gguf/_tiny.py): a Q5_K_M-style mix (Q5_K projections, Q6_K
down projections and tied embedding, as llama.cpp writes a tied one, a Q8_0 value projection)
and a file of Q5_1 projections. Packaged with `--precision int4 --int4-accuracy-level 0` every
matrix keeps its integers and the dot products stay float, so the bundle's logits equal
transformers' on the same GGUF (which dequantizes it with gguf.quants) to float32 summation
order, and onnxruntime-genai's greedy tokens equal transformers'.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

import mobius_genai
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens
from tests._hf import hf_greedy_tokens, hf_reference_logits
from tests._ort import run_like_reference
from tests.checkpoint.gguf._tiny import (
    holds_rows,
    last_logit_diffs,
    matmul_nbits_weights,
    unpermute_rows,
    write_tiny_gguf,
)

PROMPT = [5, 17, 33, 8, 200, 91, 383]
LOGITS_ATOL = 1e-4
#: fp16 activations and scales (the cuda EP's dtype) run by onnxruntime's cpu EP; seen: 0.09
#: here, 0.07 for the fp16 bundle of the dequantized weights, on logits up to ~10.
FP16_LOGITS_ATOL = 0.25
LAYERS = 3
_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
Q5_K_M = {
    "token_embd": "Q6_K",
    "attn_q": "Q5_K",
    "attn_k": "Q5_K",
    "attn_v": "Q8_0",
    "attn_output": "Q5_K",
    "ffn_gate": "Q5_K",
    "ffn_up": "Q5_K",
    "ffn_down": "Q6_K",
}
#: case → write_tiny_gguf arguments (k-quants: K a multiple of 256).
CASES = {
    "q5_k_m": {"types": Q5_K_M, "hidden_size": 256, "intermediate_size": 256},
    "q5_1": {"types": dict.fromkeys(_PROJECTIONS, "Q5_1")},
}
#: case → MatMulNBits with block mins per layer (those holding a Q5 matrix).
_WITH_MINS = {"q5_k_m": 4, "q5_1": 5}  # packed q/k/v, o, gate, up (Q5_1: down too)
#: llama.cpp's permuted rows: tensor base → heads (the tiny llama's 4 heads, 2 kv heads).
_PERMUTED = {"attn_q": 4, "attn_k": 2}


def _write(folder: Path, case: str, **changes) -> Path:
    arguments = {**CASES[case], **changes}
    return write_tiny_gguf(folder / f"{case}.gguf", "llama", layers=LAYERS, **arguments)


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """The case's GGUF and its bundle at accuracy level 0, packaged once for this module."""
    cache: dict[str, tuple[Path, Path]] = {}

    def make(case: str) -> tuple[Path, Path]:
        if case not in cache:
            folder = tmp_path_factory.mktemp(case)
            gguf = _write(folder, case)
            level_0 = Int4Options(accuracy_level=0)
            bundle = mobius_genai.package(
                gguf, "cpu", folder / "bundle", precision="int4", int4=level_0, quiet=True
            )
            cache[case] = gguf, bundle
        return cache[case]

    return make


def _build(bundle: Path) -> dict:
    return json.loads((bundle / "mobius_manifest.json").read_text())["build"]


def _kinds(gguf: Path) -> dict[str, int]:
    """GGUF type → how many matrices the file stores in it."""
    counts: dict[str, int] = {}
    for tensor in GGUFReader(gguf).tensors:
        if len(tensor.shape) == 2:
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return counts


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers_at_level_0(exact, case: str):
    gguf, bundle = exact(case)
    diffs = last_logit_diffs(gguf, bundle, PROMPT, 4)
    assert max(diffs) <= LOGITS_ATOL, diffs
    summary = _build(bundle)["prequantized"]
    assert summary["accuracy_level"] == 0
    assert summary["dequantized"] == []
    expected = {kind: {"kept 8-bit": count} for kind, count in _kinds(gguf).items()}
    assert {k: v for k, v in summary["tensors"].items() if k != "F32"} == expected


@pytest.mark.parametrize("case", list(CASES))
def test_onnxruntime_genai_greedy_equals_transformers(exact, case: str):
    gguf, bundle = exact(case)
    expected = hf_greedy_tokens(gguf, PROMPT, 16)
    assert len(set(expected)) > 8  # a model that says something, not one token repeated
    assert greedy_tokens(og.Model(str(bundle)), PROMPT, len(PROMPT) + 16) == expected


@pytest.mark.parametrize("case", list(CASES))
def test_q5_weights_are_gguf_dequantized(exact, case: str):
    """Each Q5 matrix is a run of rows of an 8-bit MatMulNBits whose ``(q - zero) * scale``
    plus block mins is gguf.quants.dequantize's value (float32 rounding of the offsets' split
    apart), its zero points uint8 (the stored integers: test_blocks.py)."""
    gguf, bundle = exact(case)
    model = onnx.load(bundle / "model.onnx")
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    weights = matmul_nbits_weights(model)
    checked = 0
    for tensor in GGUFReader(gguf).tensors:
        if tensor.tensor_type.name not in ("Q5_1", "Q5_K"):
            continue
        expected = dequantize(np.asarray(tensor.data), tensor.tensor_type)
        base = tensor.name.split(".")[2]
        if base in _PERMUTED:
            expected = unpermute_rows(expected, _PERMUTED[base])
        atol = 1e-6 * np.abs(expected).max()
        assert any(holds_rows(w, expected, atol) for w in weights), tensor.name
        checked += 1
    assert checked == sum(kind in ("Q5_1", "Q5_K") for kind in CASES[case]["types"].values()) * 3
    initializers = {t.name: t for t in model.graph.initializer}
    mins = {
        n.name.removesuffix("_mins")
        for n in model.graph.node
        if n.op_type == "MatMul" and n.name.endswith("_mins")
    }
    with_mins = [n for n in nodes if n.name in mins]  # Q5 (and a Q8_0 packed with them)
    assert len(with_mins) == _WITH_MINS[case] * LAYERS
    for node in with_mins:
        assert next(a.i for a in node.attribute if a.name == "bits") == 8
        assert initializers[node.input[3]].data_type == onnx.TensorProto.UINT8


@pytest.mark.parametrize(
    ("precision", "outcome"),
    [(None, "kept 8-bit"), ("int4", "kept 8-bit"), ("fp32", "dequantized to fp32")],
)
def test_q5_follows_q6_k_for_each_precision(tmp_path: Path, precision, outcome: str):
    """`package MODEL.gguf` and `--precision int4` keep Q5_K as they keep Q6_K (8-bit, not
    re-quantized to int4); a float precision dequantizes both. The manifest and the card say
    so per type."""
    gguf = _write(tmp_path, "q5_k_m")
    bundle = mobius_genai.package(
        gguf, "cpu", tmp_path / "bundle", precision=precision, smoke_test=False, quiet=True
    )
    counts = _kinds(gguf)
    tensors = _build(bundle)["prequantized"]["tensors"]
    assert tensors["Q5_K"] == {outcome: counts["Q5_K"]}
    assert tensors["Q6_K"] == {outcome: counts["Q6_K"]}
    card = (bundle / "README.md").read_text()
    assert f"Q5_K: {counts['Q5_K']} {outcome}" in card


def test_an_untied_q5_k_embedding_keeps_its_codes(tmp_path: Path):
    """llama.cpp's Q5_K_M stores an untied embedding in Q5_K: its lookup is an 8-bit
    GatherBlockQuantized with integer zero points plus the rows' block mins
    (tests/checkpoint/gguf/test_tables.py checks its values), no float table; the matrices stay
    8-bit and the Q6_K output is kept."""
    types = {**Q5_K_M, "token_embd": "Q5_K", "output": "Q6_K"}
    gguf = _write(tmp_path, "q5_k_m", tie=False, types=types)
    bundle = mobius_genai.package(gguf, "cpu", tmp_path / "bundle", smoke_test=False, quiet=True)
    summary = _build(bundle)["prequantized"]
    assert summary["tensors"]["Q5_K"] == {"kept 8-bit": 5 * LAYERS + 1}
    assert summary["tensors"]["Q6_K"] == {"kept 8-bit": LAYERS + 1}
    assert summary["dequantized"] == []
    assert summary["lookups"] == 1


def test_the_cuda_bundle_keeps_q5_k_in_fp16(tmp_path: Path):
    """The cuda EP's fp16 bundle keeps Q5_K as cpu's does: 8-bit MatMulNBits with uint8 zero
    points and fp16 block mins. Without a GPU here, onnxruntime's cpu EP runs the same graph:
    its logits stay within fp16 rounding of transformers' on the GGUF."""
    gguf = _write(tmp_path, "q5_k_m")
    bundle = mobius_genai.package(gguf, "cuda", tmp_path / "cuda", smoke_test=False, quiet=True)
    build = _build(bundle)
    assert (build["precision"], build["dtype"]) == ("int8", "fp16")  # its integers all 8-bit
    assert build["prequantized"]["tensors"]["Q5_K"] == {"kept 8-bit": _kinds(gguf)["Q5_K"]}
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    mins = [n for n in model.graph.node if n.op_type == "MatMul" and n.name.endswith("_mins")]
    assert len(mins) == _WITH_MINS["q5_k_m"] * LAYERS
    assert {dtypes[n.input[1]] for n in mins} == {onnx.TensorProto.FLOAT16}
    run = hf_reference_logits(gguf, np.array([PROMPT]), decode_steps=2)
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    ours = run_like_reference(session, run)
    for step, (logits, reference) in enumerate(zip(ours, run.steps, strict=True)):
        diff = np.abs(logits[:, -1].astype(np.float32) - reference.logits[:, -1]).max()
        assert diff <= FP16_LOGITS_ATOL, (step, diff)
