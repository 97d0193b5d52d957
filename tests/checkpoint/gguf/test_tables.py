"""GGUF token tables whose blocks have float offsets (Q4_1, Q4_K, Q5_1, Q5_K: w = d * q + m)
kept in their own bits: the lookup is GatherBlockQuantized on the stored codes with integer
zero points round(z) plus the looked-up rows' block mins, and a tied lm_head is MatMulNBits
with those integer zero points plus block mins (quantize/block_mins.py), never float zero
points (onnxruntime's slow path) nor a float table.

Tiny GGUFs (tests/checkpoint/gguf/_tiny.py) packaged with `--precision int4
--int4-accuracy-level 0`: the lookup equals gguf.quants.dequantize's rows to float32 rounding,
the logits equal transformers' on the same file, onnxruntime-genai's greedy tokens too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

import mobius_genai
from mobius_genai.quantize import Int4Options, stored_tables
from mobius_genai.runtime.generate import greedy_tokens
from tests._hf import hf_greedy_tokens
from tests.checkpoint.gguf._tiny import VOCAB, last_logit_diffs, write_tiny_gguf
from tests.checkpoint.gguf.test_tiny import CASES as TINY_CASES

PROMPT = [5, 17, 33, 8, 200, 91, 383]
LOGITS_ATOL = 1e-4
#: Q5_K's random tiny table holds values up to 0.7 (the others' ~0.2): the bundle's graph with
#: a float32 Gather of gguf's exact rows in place of the lookup is 1.2e-4 from transformers
#: too (summation order through 3 layers), so the bound here is the graph's, not the lookup's.
_LOGITS_ATOL = {"q5_k untied": 2e-4}
#: fp16 activations and scales run by onnxruntime's cpu EP (test_q5.py's bound).
FP16_LOGITS_ATOL = 0.25
_K_QUANTS = {"hidden_size": 256, "intermediate_size": 256}
#: case → write_tiny_gguf arguments: untied k-quant tables (llama.cpp's Q4_K_M and Q5_K_M of
#: an untied model), tied Q4_1 / Q5_1 ones (4- and 8-bit), gemma3's tied table scaled by
#: sqrt(hidden) after the lookup.
CASES = {
    "q4_k untied": {"tie": False, **_K_QUANTS, "types": {"token_embd": "Q4_K", "output": "Q6_K"}},
    "q5_k untied": {"tie": False, **_K_QUANTS, "types": {"token_embd": "Q5_K", "output": "Q6_K"}},
    "q4_1 tied": {"tie": True, "types": {"token_embd": "Q4_1"}},
    "q5_1 tied": {"tie": True, "types": {"token_embd": "Q5_1"}},
    "gemma3 q4_1 tied": {
        **{k: v for k, v in TINY_CASES["gemma3"].items() if k != "family"},
        "types": {"token_embd": "Q4_1"},
    },
}
_BITS = {"Q4_K": 4, "Q5_K": 8, "Q4_1": 4, "Q5_1": 8}


def _package(folder: Path, case: str) -> tuple[Path, Path]:
    arguments = dict(CASES[case])
    family = TINY_CASES["gemma3"]["family"] if case.startswith("gemma3") else "llama"
    gguf = write_tiny_gguf(folder / "tiny.gguf", family, **arguments)
    level_0 = Int4Options(accuracy_level=0)
    bundle = mobius_genai.package(
        gguf, "cpu", folder / "bundle", precision="int4", int4=level_0, quiet=True
    )
    return gguf, bundle


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """The case's GGUF and its bundle at accuracy level 0, packaged once for this module."""
    cache: dict[str, tuple[Path, Path]] = {}

    def make(case: str) -> tuple[Path, Path]:
        if case not in cache:
            cache[case] = _package(tmp_path_factory.mktemp(case.replace(" ", "_")), case)
        return cache[case]

    return make


def _table(gguf: Path) -> tuple[str, np.ndarray]:
    """The GGUF type of token_embd.weight and gguf.quants.dequantize's rows of it."""
    tensor = next(t for t in GGUFReader(gguf).tensors if t.name == "token_embd.weight")
    return tensor.tensor_type.name, dequantize(np.asarray(tensor.data), tensor.tensor_type)


def _lookup_error(bundle: Path, expected: np.ndarray) -> float:
    """Largest difference between the bundle's embedding lookup of every token (ids [2,
    VOCAB/2]: the lookup is rank-agnostic) and `expected` [VOCAB, hidden], run by onnxruntime
    on the graph cut from input_ids to the lookup's output (before any scale)."""
    model = onnx.load(bundle / "model.onnx")
    nodes = {node.name: node for node in model.graph.node}
    gather = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    last = nodes.get(f"{gather.name}_rows", gather)  # the rows plus their block mins
    cut = onnx.utils.Extractor(model).extract_model(["input_ids"], [last.output[0]])
    session = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(VOCAB, dtype=np.int64).reshape(2, -1)
    (rows,) = session.run(None, {"input_ids": ids})
    return float(np.abs(rows.reshape(VOCAB, -1) - expected).max())


def _heads(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The MatMulNBits reading the token table's codes (a tied lm_head)."""
    table = "model.embed_tokens.weight_Q"
    return [
        n for n in model.graph.node if n.op_type == "MatMulNBits" and n.input[1].startswith(table)
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_lookup_reads_the_stored_codes_and_equals_gguf_rows(exact, case: str):
    """No float table: the lookup's data is the uint8 codes ([VOCAB, K * bits / 8] bytes,
    shared with a tied lm_head's B), and its rows are gguf's dequantized ones to float32
    rounding of the offsets' split."""
    gguf, bundle = exact(case)
    kind, expected = _table(gguf)
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    gather = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    assert next(a.i for a in gather.attribute if a.name == "bits") == _BITS[kind]
    floats = [t for t in model.graph.initializer if t.data_type != onnx.TensorProto.UINT8]
    assert max(np.prod(t.dims) for t in floats) < expected.size  # no float table
    initializers = {t.name: t for t in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    data = gather.input[0]
    if data in producers:  # tied: a Reshape of the lm_head's B
        data = producers[data].input[0]
    codes = initializers[data]
    assert codes.data_type == onnx.TensorProto.UINT8
    assert np.prod(codes.dims) == expected.size * _BITS[kind] // 8
    assert _lookup_error(bundle, expected) <= 1e-6 * np.abs(expected).max()


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers_at_level_0(exact, case: str):
    gguf, bundle = exact(case)
    diffs = last_logit_diffs(gguf, bundle, PROMPT, 4)
    assert max(diffs) <= _LOGITS_ATOL.get(case, LOGITS_ATOL), diffs


@pytest.mark.parametrize("case", list(CASES))
def test_onnxruntime_genai_greedy_equals_transformers(exact, case: str):
    gguf, bundle = exact(case)
    expected = hf_greedy_tokens(gguf, PROMPT, 12)
    assert len(set(expected)) > 2  # a model that says something, not one token repeated
    assert greedy_tokens(og.Model(str(bundle)), PROMPT, len(PROMPT) + 12) == expected


@pytest.mark.parametrize("case", [case for case in CASES if "tied" in case.split()])
def test_a_tied_lm_head_has_integer_zero_points_plus_block_mins(exact, case: str):
    """The lm_head reads the table's codes with uint8 zero points round(z) (onnxruntime's
    fast kernels; float zero points dequantize the whole weight every call) and adds the
    activations' block sums times the block mins, which the lookup's Gather shares."""
    _, bundle = exact(case)
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    initializers = {t.name: t for t in model.graph.initializer}
    (head,) = _heads(model)
    assert initializers[head.input[3]].data_type == onnx.TensorProto.UINT8
    mins = next(n for n in model.graph.node if n.name == f"{head.name}_mins")
    row_mins = next(n for n in model.graph.node if n.name.endswith("_row_mins"))
    assert row_mins.input[0] == mins.input[1]  # one copy of the mins
    summary = json.loads((bundle / "mobius_manifest.json").read_text())["build"]["prequantized"]
    assert summary["zero_points"]["float"] >= 1  # counted as float offsets, written as above


@pytest.mark.parametrize("case", ["q4_k untied", "q5_1 tied"])
def test_manifest_and_card_say_the_table_is_kept(exact, case: str):
    gguf, bundle = exact(case)
    kind, _ = _table(gguf)
    summary = json.loads((bundle / "mobius_manifest.json").read_text())["build"]["prequantized"]
    assert summary["dequantized"] == []
    assert summary["lookups"] == 1
    outcome = f"kept {_BITS[kind]}-bit"
    assert outcome in summary["tensors"][kind]
    assert "dequantized to fp32" not in summary["tensors"][kind]
    card = (bundle / "README.md").read_text()
    assert "1 embedding lookup(s) from the stored integers" in card
    assert f"{kind}: {summary['tensors'][kind][outcome]} {outcome}" in card


@pytest.mark.parametrize("case", ["q4_k untied", "q4_1 tied"])
def test_a_lookup_without_its_block_mins_fails(tmp_path: Path, monkeypatch, case: str):
    """Mutant: the row mins dropped, the lookup is off by up to half a step per block, far
    outside the tolerance the real one meets."""
    monkeypatch.setattr(stored_tables, "plus_row_mins", lambda *args: [])
    gguf, bundle = _package(tmp_path, case)
    _, expected = _table(gguf)
    assert _lookup_error(bundle, expected) > 100 * 1e-6 * np.abs(expected).max()


def test_an_ep_without_gather_block_quantized_looks_up_in_float(tmp_path: Path):
    """dml has no GatherBlockQuantized: the lookup stays float (the table read as its
    dequantized rows) and the manifest says so; the tied lm_head still reads the codes with
    integer zero points plus block mins."""
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", **CASES["q4_1 tied"])
    bundle = mobius_genai.package(gguf, "dml", tmp_path / "bundle", smoke_test=False, quiet=True)
    summary = json.loads((bundle / "mobius_manifest.json").read_text())["build"]["prequantized"]
    assert summary["lookups"] == 0
    assert summary["dequantized"] == [
        "model.embed_tokens.weight (no GatherBlockQuantized for FLOAT16 on this EP: lookup in float)"
    ]
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    assert "GatherBlockQuantized" not in {n.op_type for n in model.graph.node}
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    (head,) = _heads(model)
    assert dtypes[head.input[3]] == onnx.TensorProto.UINT8
    assert any(n.name == f"{head.name}_mins" for n in model.graph.node)


@pytest.mark.parametrize("case", ["q4_k untied", "q4_1 tied"])
def test_the_cuda_bundle_keeps_the_table_in_fp16(tmp_path: Path, case: str):
    """cuda's fp16 bundle: the same lookup with fp16 scales and mins (cuda has
    GatherBlockQuantized for fp16). Without a GPU here, onnxruntime's cpu EP runs the same
    graph: the logits stay within fp16 rounding of transformers' on the GGUF (as test_q5.py's
    cuda bundle)."""
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", **CASES[case])
    bundle = mobius_genai.package(gguf, "cuda", tmp_path / "cuda", smoke_test=False, quiet=True)
    summary = json.loads((bundle / "mobius_manifest.json").read_text())["build"]["prequantized"]
    assert (summary["lookups"], summary["dequantized"]) == (1, [])
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    gather = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    row_mins = next(n for n in model.graph.node if n.name == f"{gather.name}_row_mins")
    assert dtypes[gather.input[2]] == dtypes[row_mins.input[0]] == onnx.TensorProto.FLOAT16
    assert max(last_logit_diffs(gguf, bundle, PROMPT, 2)) <= FP16_LOGITS_ATOL
