"""Packed weights whose parts a recipe stores in different formats (format_split.py)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.weights import ConcatTensor
from mobius_genai.quantize.format_split import packed_format, split_mixed_formats
from mobius_genai.quantize.recipes import WeightFormat
from mobius_genai.quantize.weight_uses import find_weights
from tests.quantize.test_weight_uses import F32, MS, _model, _run

NAMES = tuple(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
WIDTHS = (32, 16, 16)


def _format_of(name: str, _group) -> WeightFormat:
    """q in 4 bits, k and v in 8 (as `mixed`)."""
    return WeightFormat(4, 32) if "q_proj" in name else WeightFormat(8, 64)


def _packed_graph(op: str) -> tuple[ir.Model, dict[str, np.ndarray]]:
    """`op`(x, [Wq | Wk | Wv]) with the packed weight a ConcatTensor, as PackQKV makes it."""
    rng = np.random.default_rng(0)
    parts = [
        ir.tensor(rng.standard_normal((64, n)).astype(np.float32), name=name)
        for name, n in zip(NAMES, WIDTHS, strict=True)
    ]
    name = "model.layers.0.self_attn.qkv_proj.weight"
    packed = ir.Value(
        name=name,
        type=ir.TensorType(F32),
        shape=ir.Shape([64, sum(WIDTHS)]),
        const_value=ConcatTensor(parts, 1, F32, name),
    )
    x = ir.val("x", F32, ir.Shape([2, 3, 64]))
    node = ir.node(op, [x, packed], domain=MS if op == "FusedMatMul" else "", name="qkv")
    feeds = {"x": rng.standard_normal((2, 3, 64)).astype(np.float32)}
    return _model([node], [x], [packed]), feeds


def test_parts_of_different_formats_become_one_matmul_per_run():
    """q (4-bit) and k+v (8-bit): two MatMuls and a Concat, the same outputs as before."""
    model, feeds = _packed_graph("MatMul")
    before = _run(model, feeds)
    groups, _ = find_weights(model.graph)
    split = split_mixed_formats(model.graph, groups, _format_of)
    assert [(g.source.name, g.source.n) for g in split] == [
        (NAMES[0], 32),
        ("model.layers.0.self_attn.k_proj+v_proj.weight", 32),
    ]
    assert [packed_format(g, _format_of) for g in split] == [
        WeightFormat(4, 32),
        WeightFormat(8, 64),
    ]
    assert [node.op_type for node in model.graph] == ["MatMul", "MatMul", "Concat"]
    # typed as their weights (a value with a shape and no type cannot be serialized whole)
    assert [node.outputs[0].dtype for node in model.graph][:2] == [F32, F32]
    assert "model.layers.0.self_attn.qkv_proj.weight" not in model.graph.initializers
    np.testing.assert_array_equal(_run(model, feeds), before)


def test_parts_of_one_format_stay_packed():
    model, _ = _packed_graph("MatMul")
    groups, _ = find_weights(model.graph)
    split = split_mixed_formats(model.graph, groups, lambda name, group: WeightFormat(4, 32))
    assert split == groups
    assert [node.op_type for node in model.graph] == ["MatMul"]


def test_a_packed_weight_it_cannot_split_takes_its_widest_part_format():
    """A FusedMatMul use has no split here: the whole weight gets k/v's 8 bits."""
    model, _ = _packed_graph("FusedMatMul")
    groups, _ = find_weights(model.graph)
    split = split_mixed_formats(model.graph, groups, _format_of)
    assert split == groups
    assert packed_format(split[0], _format_of) == WeightFormat(8, 64)
