"""EliminateShapePass: a Shape-free decoder (webgpu); graph checks and ORT CPU before/after."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from mobius_genai.optimize.rules import gqa
from mobius_genai.optimize.rules.eliminate_shape import EliminateShapePass
from tests.optimize._graphs import (
    apply,
    clone,
    max_diff,
    nodes,
    op_counts,
    run_decoder,
    session,
    tiny_config,
    tiny_decoder,
)

TOLERANCE = 1e-4  # f32 logits, max abs diff before vs after, prefill + 4 decode steps


def test_gqa_decoder_has_no_shape_left():
    model, _ = tiny_decoder(tiny_config(num_hidden_layers=3))
    apply(model, gqa.rules())
    assert op_counts(model)["Shape"] == 1  # total_sequence_length
    shape_pass = EliminateShapePass()
    assert apply(model, shape_pass) == [1]
    assert shape_pass.kept == []
    assert op_counts(model)["Shape"] == 0
    total = nodes(model, "GroupQueryAttention")[0].inputs[gqa.TOTAL_SEQ_LEN]
    assert all(n.inputs[gqa.TOTAL_SEQ_LEN] is total for n in nodes(model, "GroupQueryAttention"))
    reduce_max = total.producer().inputs[0].producer().inputs[0].producer()
    assert reduce_max.op_type == "ReduceMax"


def test_dead_shapes_are_left_to_dead_node_removal():
    model, _ = tiny_decoder(tiny_config())
    input_ids = next(value for value in model.graph.inputs if value.name == "input_ids")
    dead = ir.node("Shape", [input_ids], attributes={"start": 1})
    model.graph.append(dead)  # nothing reads it
    EliminateShapePass()(model)
    assert dead.graph is model.graph


def test_portable_decoder_has_no_shape_left():
    model, _ = tiny_decoder(tiny_config())
    read = {node.inputs[0].name for node in nodes(model, "Shape")}
    assert read == {"input_ids", "attention_mask"}  # the mask's and kv_slots.py's sizes
    apply(model, EliminateShapePass())
    assert op_counts(model)["Shape"] == 0


def _shape_graph(source_shape: list, dtype: ir.DataType, **attributes: int) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(dtype), shape=ir.Shape(source_shape))
    shape = ir.node("Shape", [x], attributes=attributes)
    shape.outputs[0].name = "shape"
    graph = ir.Graph([x], [shape.outputs[0]], nodes=[shape], opset_imports={"": 21})
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, x: np.ndarray) -> np.ndarray:
    return session(model, ort_optimizations=True).run(None, {"x": x})[0]


def test_static_dimensions_become_constants():
    model = _shape_graph(["batch", 7, 3], ir.DataType.FLOAT, start=1)
    shape_pass = EliminateShapePass()
    assert shape_pass(model).modified
    assert op_counts(model)["Shape"] == 0
    output = model.graph.outputs[0]
    np.testing.assert_array_equal(output.producer().outputs[0].const_value.numpy(), [7, 3])


@pytest.mark.parametrize("attributes", [{}, {"start": 1}, {"start": 0, "end": 1}, {"start": -1}])
def test_dimensions_of_integer_inputs_are_counted(attributes):
    model = _shape_graph(["batch", "seq"], ir.DataType.INT64, **attributes)
    x = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=np.int64)  # padding either side
    expected = _run(model, x)
    assert EliminateShapePass()(model).modified
    assert op_counts(model)["Shape"] == 0
    np.testing.assert_array_equal(_run(model, x), expected)


def test_shapes_it_cannot_replace_are_kept_with_a_reason():
    model = _shape_graph(["batch", "seq", 4], ir.DataType.FLOAT)
    shape_pass = EliminateShapePass()
    assert not shape_pass(model).modified
    assert op_counts(model)["Shape"] == 1
    assert len(shape_pass.kept) == 1 and "not countable" in shape_pass.kept[0]


@pytest.mark.parametrize("fuse", [False, True], ids=["portable", "gqa"])
def test_rewritten_model_runs_with_ort(fuse, tmp_path):
    config = tiny_config(sliding_window=5, layer_types=("sliding_attention", "full_attention"))
    model, _ = tiny_decoder(config)
    if fuse:
        apply(model, gqa.rules())
    before = run_decoder(model, config, tmp_path / "before")
    shapeless = clone(model)
    apply(shapeless, EliminateShapePass())
    assert op_counts(shapeless)["Shape"] == 0
    after = run_decoder(shapeless, config, tmp_path / "after")
    assert max_diff(before, after) <= TOLERANCE
