"""A GGUF packaged with an explicit int4 request: the matrices kept exactly stay as stored, the
ones that would be dequantized (Q3_K, F16) are quantized to int4 instead.

The reference for the re-quantized weights is gguf's own dequantization of the stored tensor:
the bundle's MatMulNBits must hold it within int4 rounding error, and not exactly (else it
would not have been quantized again).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime_genai as og
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize
from onnx import numpy_helper

import mobius_genai
from mobius_genai.quantize import DEFAULT_QUALITY, Int4Options
from mobius_genai.runtime.generate import greedy_tokens
from tests.checkpoint.gguf._tiny import matmul_nbits_weights, write_tiny_gguf

#: k-quants need K a multiple of 256. Q4_K and a Q8_0 embedding are kept as stored; the
#: Q3_K gate and F16 up projections are dequantized by default.
TYPES = {
    "token_embd": "Q8_0",
    "attn_q": "Q4_K",
    "attn_k": "Q4_K",
    "attn_v": "Q4_K",
    "attn_output": "Q4_K",
    "ffn_gate": "Q3_K",
    "ffn_up": "F16",
    "ffn_down": "Q4_K",
}
LAYERS = 3
REQUANTIZED = f"re-quantized to int4 (block 32, recipe {DEFAULT_QUALITY})"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The GGUF, its default bundle and its bundle with precision int4 (smoke-tested: the
    packager generates from it with onnxruntime-genai)."""
    folder = tmp_path_factory.mktemp("requantize")
    gguf = write_tiny_gguf(
        folder / "mixed.gguf",
        "llama",
        tie=True,
        hidden_size=256,
        intermediate_size=256,
        layers=LAYERS,
        types=TYPES,
    )
    default = mobius_genai.package(gguf, "cpu", folder / "default", quiet=True)
    int4 = mobius_genai.package(gguf, "cpu", folder / "int4", precision="int4", quiet=True)
    return gguf, default, int4


def _nodes(bundle: Path) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    model = onnx.load(bundle / "model.onnx")
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return list(model.graph.node), arrays


def _float_matmuls(bundle: Path) -> list[str]:
    """MatMul nodes whose B is a float initializer (a weight left in float; not the block
    mins that stand for float zero points)."""
    nodes, arrays = _nodes(bundle)
    return [
        n.name
        for n in nodes
        if n.op_type == "MatMul" and n.input[1] in arrays and not n.name.endswith("_mins")
    ]


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "mobius_manifest.json").read_text())["build"]


def test_every_matrix_is_matmul_nbits_with_int4(bundles):
    _, default, int4 = bundles
    assert len(_float_matmuls(default)) == 2 * LAYERS  # Q3_K gate and F16 up stay float
    assert _float_matmuls(int4) == []
    nodes, _ = _nodes(int4)
    levels = {
        next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
        for n in nodes
        if n.op_type == "MatMulNBits"
    }
    assert levels == {4}  # one level, cpu's default, the stored 8-bit embedding's too


def test_kept_weights_keep_their_integers(bundles):
    """Every MatMulNBits of the default bundle (Q4_K, the Q8_0 lm_head) is in the int4 bundle
    with the same inputs, byte for byte."""
    _, default, int4 = bundles
    kept, kept_arrays = _nodes(default)
    ours, arrays = _nodes(int4)
    by_name = {n.name: n for n in ours}
    checked = 0
    for node in kept:
        if node.op_type != "MatMulNBits":
            continue
        twin = by_name[node.name]
        assert twin.attribute == node.attribute
        for a, b in zip(node.input[1:], twin.input[1:], strict=True):
            np.testing.assert_array_equal(kept_arrays[a], arrays[b])
        checked += 1
    assert checked == 3 * LAYERS + 1  # packed qkv, o, down per layer and the tied lm_head


def test_dequantized_kinds_are_quantized_to_int4(bundles):
    """The Q3_K and F16 matrices are in 4-bit MatMulNBits within int4 rounding error of gguf's
    dequantized values, not exactly. Round-to-nearest errs by at most max|w| / 8 in a block
    (symmetric: a value of the other sign than the largest |w| clips at 7); the default
    recipe's search may clip a block's extremes further to lower the rest's error (seen:
    0.127 max|w|), so the bound is two such steps."""
    gguf, _, int4 = bundles
    model = onnx.load(int4 / "model.onnx")
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    four_bit = [
        weight
        for weight, node in zip(matmul_nbits_weights(model), nodes, strict=True)
        if next(a.i for a in node.attribute if a.name == "bits") == 4
    ]
    checked = 0
    for tensor in GGUFReader(gguf).tensors:
        if tensor.tensor_type.name not in ("Q3_K", "F16"):
            continue
        expected = dequantize(np.asarray(tensor.data), tensor.tensor_type).astype(np.float32)
        blocks = np.abs(expected.reshape(expected.shape[0], -1, 32)).max(axis=-1)
        bound = np.repeat(blocks / 4 * 1.001 + 1e-7, 32, axis=-1)
        matches = [
            w[start : start + len(expected)]
            for w in four_bit
            if w.shape[1] == expected.shape[1]
            for start in range(0, w.shape[0] - len(expected) + 1, len(expected))
        ]
        close = [m for m in matches if np.all(np.abs(m - expected) <= bound)]
        assert close, tensor.name
        assert not any(np.array_equal(m, expected) for m in close), tensor.name
        checked += 1
    assert checked == 2 * LAYERS


def test_manifest_says_requantized_per_kind(bundles):
    _, default, int4 = bundles
    assert _manifest(default)["prequantized"]["tensors"] == {
        "F32": {"float (fp32)": 2 * LAYERS + 1},
        "Q4_K": {"kept 4-bit": 5 * LAYERS},
        "F16": {"float (fp32)": LAYERS},
        "Q3_K": {"dequantized to fp32": LAYERS},
        "Q8_0": {"kept 8-bit": 1},
    }
    build = _manifest(int4)
    assert build["prequantized"]["tensors"] == {
        "F32": {"float (fp32)": 2 * LAYERS + 1},
        "Q4_K": {"kept 4-bit": 5 * LAYERS},
        "F16": {REQUANTIZED: LAYERS},
        "Q3_K": {REQUANTIZED: LAYERS},
        "Q8_0": {"kept 8-bit": 1},
    }
    assert build["precision"] == "int4"
    card = (int4 / "README.md").read_text()
    assert f"Q3_K: {LAYERS} {REQUANTIZED}" in card


def test_onnxruntime_genai_generates_from_the_int4_bundle(bundles):
    _, _, int4 = bundles
    assert _manifest(int4)["smoke_test"]["ran"]
    tokens = greedy_tokens(og.Model(str(int4)), [5, 17, 33, 8], 12)
    assert tokens


def test_asked_accuracy_level_applies_to_every_matmul_nbits(tmp_path: Path, bundles, capsys):
    gguf, _, _ = bundles
    bundle = mobius_genai.package(
        gguf,
        "cpu",
        tmp_path / "level4",
        int4=Int4Options(accuracy_level=4),
        precision="int4",
        smoke_test=False,
    )
    note = f"{2 * LAYERS} it could not keep re-quantized with the int4 options asked"
    assert note in capsys.readouterr().err
    nodes, _ = _nodes(bundle)
    levels = {
        next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
        for n in nodes
        if n.op_type == "MatMulNBits"
    }
    assert levels == {4}
    assert _manifest(bundle)["prequantized"]["accuracy_level"] == 4


#: An untied lm_head ("output") stored in float or in a block type, per int4 recipe: what the
#: manifest says became of it.
LM_HEADS = {
    "float-builder": ("F16", "builder", "float (fp32)"),
    "float-balanced": ("F16", "balanced", "re-quantized to int8 (block 128, recipe balanced)"),
    "q3_k-builder": ("Q3_K", "builder", "re-quantized to int4 (block 32, recipe builder)"),
}


@pytest.mark.parametrize("case", list(LM_HEADS))
def test_lm_head_kept_in_float_by_the_source_stays_float_unless_the_recipe_widens_it(
    tmp_path: Path, case: str
):
    """A table the source stored in float is left in float by the 4-bit recipes (quantizing
    it changes the model more than the source did); `balanced` keeps lm_heads in 8 bits, and
    a table the source stored quantized is quantized as the recipe says."""
    kind, quality, outcome = LM_HEADS[case]
    gguf = write_tiny_gguf(
        tmp_path / "untied.gguf",
        "llama",
        tie=False,
        hidden_size=256,
        intermediate_size=256,
        types={"output": kind},
    )
    bundle = mobius_genai.package(
        gguf,
        "cpu",
        tmp_path / "bundle",
        precision="int4",
        int4=Int4Options(quality=quality),
        smoke_test=False,
        quiet=True,
    )
    assert _manifest(bundle)["prequantized"]["tensors"][kind] == {outcome: 1}
    assert len(_float_matmuls(bundle)) == (1 if outcome.startswith("float") else 0)


@pytest.mark.parametrize("precision", [None, "int4"])
def test_quantized_k_and_v_packed_beside_a_float_q_are_read_as_float(tmp_path, precision):
    """q stored F16 beside Q4_1 k and Q4_0 v: one packed q/k/v MatMul reads them all, so k and v
    are read as their dequantized values, counted so, and (int4) quantized with q."""
    gguf = write_tiny_gguf(tmp_path / "m.gguf", "llama", layers=2, types={"attn_q": "F16"})
    bundle = mobius_genai.package(gguf, "cpu", tmp_path / "out", precision=precision, quiet=True)
    prequantized = _manifest(bundle)["prequantized"]
    packed = [f"model.layers.{i}.self_attn.qkv_proj.weight" for i in range(2)]
    assert prequantized["dequantized"] == [f"{name} (packed with float parts)" for name in packed]
    tensors = prequantized["tensors"]
    read = (
        "dequantized to fp32"
        if precision is None
        else next(outcome for outcome in tensors["F16"] if outcome.startswith("re-quantized"))
    )
    assert tensors["Q4_1"][read] == 2 and tensors["Q4_0"][read] == 2
    assert tensors["F16"] == {("float (fp32)" if precision is None else read): 2}
