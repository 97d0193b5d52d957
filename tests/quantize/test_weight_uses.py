"""Which uses of which initializers are quantized (synthetic graphs, one construct each)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from mobius_genai.ep import get_ep
from mobius_genai.quantize import Int4Options, quantize_int4
from mobius_genai.quantize.layout import dequantize_matmul_nbits, quantize_matmul_nbits
from mobius_genai.quantize.weight_uses import find_weights

F32 = ir.DataType.FLOAT
MS = "com.microsoft"


def _weight(name: str, array: np.ndarray) -> ir.Value:
    return ir.Value(
        name=name,
        type=ir.TensorType(F32),
        shape=ir.Shape(array.shape),
        const_value=ir.tensor(array, name=name),
    )


def _model(nodes: list[ir.Node], inputs, weights, opsets=None) -> ir.Model:
    for i, node in enumerate(nodes):
        node.outputs[0].name = node.outputs[0].name or f"t{i}"
    graph = ir.Graph(
        inputs,
        [nodes[-1].outputs[0]],
        nodes=nodes,
        initializers=weights,
        opset_imports=opsets or {"": 24, MS: 1},
    )
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, feeds) -> np.ndarray:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


def test_concatenated_projection_is_quantized_as_one_weight():
    """MatMul(x, Concat(Wq, Wk, Wv, axis=1)): one MatMulNBits over the concatenation."""
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((32, n)).astype(np.float32) for n in (32, 16, 16)]
    weights = [_weight(f"w{i}", p) for i, p in enumerate(parts)]
    x = ir.val("x", F32, ir.Shape([2, 3, 32]))
    concat = ir.node("Concat", weights, {"axis": 1})
    matmul = ir.node("MatMul", [x, concat.outputs[0]])
    model = _model([concat, matmul], [x], weights)
    report = quantize_int4(
        model, Int4Options(block_size=16, accuracy_level=0, quality="builder"), get_ep("cpu")
    )
    assert [(w.name, w.k, w.n) for w in report.weights] == [("w0", 32, 64)]
    assert [node.op_type for node in model.graph] == ["MatMulNBits"]
    assert not model.graph.initializers.keys() & {"w0", "w1", "w2"}
    feeds = {"x": rng.standard_normal((2, 3, 32)).astype(np.float32)}
    whole = np.concatenate(parts, axis=1)
    expected = feeds["x"] @ dequantize_matmul_nbits(quantize_matmul_nbits(whole, 16, True), 32)
    np.testing.assert_allclose(_run(model, feeds), expected, atol=1e-5)


def test_fused_matmul_with_transposed_table_reads_it_as_n_by_k():
    rng = np.random.default_rng(1)
    table = rng.standard_normal((40, 32)).astype(np.float32)  # [vocab, hidden]
    w = _weight("table", table)
    x = ir.val("x", F32, ir.Shape([1, 2, 32]))
    fused = ir.node("FusedMatMul", [x, w], {"transB": 1}, domain=MS)
    model = _model([fused], [x], [w])
    report = quantize_int4(
        model, Int4Options(block_size=16, accuracy_level=0, quality="builder"), get_ep("cpu")
    )
    assert [(w.name, w.k, w.n, w.ops) for w in report.weights] == [
        ("table", 32, 40, ("MatMulNBits",))
    ]
    feeds = {"x": rng.standard_normal((1, 2, 32)).astype(np.float32)}
    expected = feeds["x"] @ dequantize_matmul_nbits(quantize_matmul_nbits(table.T, 16, True), 32)
    np.testing.assert_allclose(_run(model, feeds), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [({"alpha": 0.5, "transB": 1}, "alpha=0.5"), ({"transA": 1}, "transA=1")],
)
def test_fused_matmul_that_matmul_nbits_cannot_express_is_declined(attributes, reason):
    w = _weight("w", np.ones((32, 32), np.float32))
    x = ir.val("x", F32, ir.Shape([2, 32, 32]))
    fused = ir.node("FusedMatMul", [x, w], attributes, domain=MS)
    model = _model([fused], [x], [w])
    report = quantize_int4(model, Int4Options(block_size=16), get_ep("cpu"))
    assert report.weights == ()
    assert [text.split(" ")[0] for _, text in report.declined] == [reason]
    assert [node.op_type for node in model.graph] == ["FusedMatMul"]


def test_activations_overridable_weights_and_other_axes_are_left_alone():
    a = ir.val("a", F32, ir.Shape([2, 32]))
    b = ir.val("b", F32, ir.Shape([32, 32]))
    overridable = _weight("overridable", np.ones((32, 32), np.float32))
    table = _weight("table", np.ones((32, 32), np.float32))
    positions = _weight("positions", np.ones((32, 32), np.float32))
    ids = ir.val("input_ids", ir.DataType.INT64, ir.Shape([3]))
    position_ids = ir.val("position_ids", ir.DataType.INT64, ir.Shape([3]))
    m1 = ir.node("MatMul", [a, b])  # activation @ activation
    m2 = ir.node("MatMul", [m1.outputs[0], overridable])  # initializer that is a graph input
    g1 = ir.node("Gather", [table, ids], {"axis": 1})  # not a row lookup
    g2 = ir.node("Gather", [positions, position_ids])  # learned position embeddings
    add = ir.node("Add", [g1.outputs[0], g2.outputs[0]])
    model = _model(
        [m1, m2, g1, g2, add],
        [a, b, overridable, ids, position_ids],
        [overridable, table, positions],
    )
    groups, declined = find_weights(model.graph)
    assert groups == []
    assert [d.reason for d in declined] == [
        "Gather axis is not 0",
        "lookup not indexed by input_ids (not the token embedding)",
    ]


def _mapped_lookup(other: ir.Value) -> tuple[ir.Model, list[ir.Value]]:
    """Gather(table, Where(ids == 5, other, input_ids)): image tokens (id 5) read `other`."""
    table = _weight("table", np.random.default_rng(2).standard_normal((8, 32)).astype(np.float32))
    ids = ir.val("input_ids", ir.DataType.INT64, ir.Shape([1, 4]))
    five = ir.node("Constant", [], {"value_int": 5})
    is_image = ir.node("Equal", [ids, five.outputs[0]])
    mapped = ir.node("Where", [is_image.outputs[0], other, ids])
    gather = ir.node("Gather", [table, mapped.outputs[0]])
    nodes = [five, is_image, mapped, gather]
    return nodes, [ids, table]


def test_a_lookup_by_token_ids_some_mapped_to_a_constant_row_is_quantized():
    """A vision-language decoder's image tokens read the pad token's per-layer row: the lookup
    still reads rows of the token table, so it becomes GatherBlockQuantized with the mapped
    ids, and gives the dequantized table's rows."""
    pad = ir.node("Constant", [], {"value_int": 0})
    nodes, (ids, table) = _mapped_lookup(pad.outputs[0])
    array = table.const_value.numpy().copy()
    model = _model([pad, *nodes], [ids], [table])
    report = quantize_int4(
        model, Int4Options(block_size=16, accuracy_level=0, quality="builder"), get_ep("cpu")
    )
    assert [(w.name, w.ops) for w in report.weights] == [("table", ("GatherBlockQuantized",))]
    feeds = {"input_ids": np.array([[3, 5, 7, 5]], np.int64)}
    rows = dequantize_matmul_nbits(quantize_matmul_nbits(array.T, 16, True), 32).T
    np.testing.assert_allclose(_run(model, feeds), rows[[[3, 0, 7, 0]]], atol=1e-6)


def test_a_lookup_by_ids_mixed_with_another_input_stays_float():
    """Where(.., position_ids, input_ids): not every index is a token id (or a fixed row)."""
    positions = ir.val("position_ids", ir.DataType.INT64, ir.Shape([1, 4]))
    nodes, (ids, table) = _mapped_lookup(positions)
    groups, declined = find_weights(_model(nodes, [ids, positions], [table]).graph)
    assert groups == []
    assert [d.reason for d in declined] == [
        "lookup not indexed by input_ids (not the token embedding)"
    ]
