"""PruneLmHeadPass: logits of each sequence's last token only; graph checks and ORT CPU runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from mobius_genai.optimize import optimize_model
from mobius_genai.optimize.rules.prune_lm_head import PruneLmHeadPass
from tests.optimize._graphs import clone, nodes, run_decoder, session, tiny_config, tiny_decoder

TOLERANCE = 1e-5  # f32: the same rows computed with a different number of rows (GEMM blocking)


def _optimized(ep: str, prune: bool, layers: int = 2) -> tuple[ir.Model, object]:
    config = tiny_config(num_hidden_layers=layers, qkv_bias=True, lm_head_bias=False)
    model, _ = tiny_decoder(config)
    report = optimize_model(model, ep, ir.DataType.FLOAT, prune_lm_head=prune)
    return model, report


def _logits(model: ir.Model) -> ir.Value:
    return next(value for value in model.graph.outputs if value.name == "logits")


def test_off_by_default_and_every_position_kept():
    model, report = _optimized("cpu", prune=False)
    assert "prune_lm_head=False" in report.skipped["PruneLmHead"]
    assert not nodes(model, "GatherND")
    assert str(_logits(model).shape[1]) == "sequence_length"


def test_cpu_decoder_gathers_the_two_activations_after_the_last_attention():
    model, report = _optimized("cpu", prune=True, layers=3)
    assert report.rules["PruneLmHead"].matched == 2
    assert list(_logits(model).shape)[1] == 1
    gathers = nodes(model, "GatherND")
    assert len(gathers) == 2
    sources = {g.inputs[0].producer().op_type for g in gathers}
    # The last attention's output and the residual stream (a fused skip norm's sum output).
    assert sources == {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"}
    last_attention = nodes(model, "GroupQueryAttention")[-1]
    assert any(g.inputs[0] is last_attention.outputs[0] for g in gathers)
    # Attention itself and everything before it still see every position.
    for attention in nodes(model, "GroupQueryAttention"):
        assert str(attention.inputs[0].shape[1]) == "sequence_length"
    # The LM head reads a gathered row: one position per sequence.
    head = _logits(model).producer()
    assert head.op_type == "MatMul"  # untied lm_head
    assert list(head.inputs[0].shape)[1] == 1


def test_a_graph_without_weights_is_pruned_the_same_way():
    config = tiny_config(num_hidden_layers=2)
    model, _ = tiny_decoder(config, weights="none")
    report = optimize_model(model, "cpu", ir.DataType.FLOAT, prune_lm_head=True)
    assert report.rules["PruneLmHead"].matched == 2


def _random_run(model: ir.Model, tmp_path: Path, config) -> list[np.ndarray]:
    return run_decoder(clone(model), config, tmp_path, batch=2, prefill=9, decode_steps=3)


@pytest.mark.parametrize("ep", ["cpu", "default", "onnx-standard"])
def test_last_position_logits_equal_the_full_graphs(ep: str, tmp_path: Path):
    config = tiny_config(num_hidden_layers=2, qkv_bias=True)
    full, _ = tiny_decoder(config)
    pruned = clone(full)
    optimize_model(full, ep, ir.DataType.FLOAT)
    report = optimize_model(pruned, ep, ir.DataType.FLOAT, prune_lm_head=True)
    assert report.rules["PruneLmHead"].matched == 2
    every = _random_run(full, tmp_path / "full", config)
    last = _random_run(pruned, tmp_path / "pruned", config)
    for full_logits, pruned_logits in zip(every, last, strict=True):
        assert pruned_logits.shape == (2, 1, config.vocab_size)
        diff = np.abs(pruned_logits[:, 0] - full_logits[:, -1]).max()
        assert diff <= TOLERANCE


def _session(model: ir.Model, path: Path) -> ort.InferenceSession:
    return session(clone(model), path, ort_optimizations=True)


def test_right_padded_prompts_get_their_last_real_tokens_logits(tmp_path: Path):
    """onnxruntime-genai pads batched prompts on the right: the row read is the last mask-1."""
    config = tiny_config(num_hidden_layers=2)
    full, _ = tiny_decoder(config)
    pruned = clone(full)
    optimize_model(full, "cpu", ir.DataType.FLOAT)
    optimize_model(pruned, "cpu", ir.DataType.FLOAT, prune_lm_head=True)
    ids = np.random.default_rng(3).integers(3, config.vocab_size, size=(3, 7))
    mask = np.ones((3, 7), np.int64)
    mask[1, 4:] = 0  # 4 real tokens then padding
    mask[2, 1:] = 0  # 1 real token
    feeds = {"input_ids": ids, "attention_mask": mask}
    for i in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((3, 2, 0, 16), np.float32)
    every = _session(full, tmp_path / "full").run(["logits"], feeds)[0]
    last = _session(pruned, tmp_path / "pruned").run(["logits"], feeds)[0]
    rows = [6, 3, 0]
    assert last.shape == (3, 1, config.vocab_size)
    for b, row in enumerate(rows):
        assert np.abs(last[b, 0] - every[b, row]).max() <= TOLERANCE


# --- graphs built by hand: what the pass refuses ----------------------------------------------


def _head_graph(
    constant_shape: list[int], *, extra_output: bool = False, inputs: bool = True
) -> ir.Model:
    """hidden [batch, sequence_length, 8] → MatMul W [8, 4] → Add C → logits."""
    batch, seq = ir.SymbolicDim("batch_size"), ir.SymbolicDim("sequence_length")
    hidden = ir.Value(
        name="hidden", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([batch, seq, 8])
    )
    graph_inputs = [hidden]
    if inputs:
        for name, dim in (("input_ids", seq), ("attention_mask", ir.SymbolicDim("total"))):
            graph_inputs.append(
                ir.Value(
                    name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([batch, dim])
                )
            )
    rng = np.random.default_rng(0)
    weight = ir.Value(name="W", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([8, 4]))
    weight.const_value = ir.tensor(rng.standard_normal((8, 4)).astype(np.float32), name="W")
    bias = ir.Value(name="C", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(constant_shape))
    bias.const_value = ir.tensor(rng.standard_normal(constant_shape).astype(np.float32), name="C")
    matmul = ir.node("MatMul", [hidden, weight], name="head")
    projected = matmul.outputs[0]
    projected.name, projected.dtype = "projected", ir.DataType.FLOAT
    projected.shape = ir.Shape([batch, seq, 4])
    add = ir.node("Add", [projected, bias], name="bias")
    logits = add.outputs[0]
    logits.name, logits.dtype, logits.shape = "logits", ir.DataType.FLOAT, ir.Shape([batch, seq, 4])
    outputs = [logits, projected] if extra_output else [logits]
    graph = ir.Graph(
        graph_inputs,
        outputs,
        nodes=[matmul, add],
        initializers=[weight, bias],
        opset_imports={"": 24},
    )
    return ir.Model(graph, ir_version=10)


def _run_head(model: ir.Model, tmp_path: Path, hidden: np.ndarray) -> list[np.ndarray]:
    batch, seq, _ = hidden.shape
    feeds = {
        "hidden": hidden,
        "input_ids": np.zeros((batch, seq), np.int64),
        "attention_mask": np.ones((batch, seq), np.int64),
    }
    head = _session(model, tmp_path)
    names = {value.name for value in head.get_inputs()}
    return head.run(None, {k: v for k, v in feeds.items() if k in names})


def test_a_bias_without_sequence_axis_is_part_of_the_tail(tmp_path: Path):
    model = _head_graph([4])
    pruning = PruneLmHeadPass()
    assert pruning(model).modified
    assert [node.name for node in pruning.tail] == ["head", "bias"]
    hidden = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    before = _run_head(_head_graph([4]), tmp_path / "before", hidden)[0]
    after = _run_head(model, tmp_path / "after", hidden)[0]
    np.testing.assert_allclose(after[:, 0], before[:, -1], atol=TOLERANCE, rtol=0)


def test_a_constant_with_a_sequence_extent_stops_the_tail():
    model = _head_graph([1, 5, 4])
    pruning = PruneLmHeadPass()
    assert not pruning(model).modified
    assert pruning.kept == ["the node computing 'logits' does not work row by row"]


def test_a_value_that_is_also_a_graph_output_keeps_every_position(tmp_path: Path):
    model = _head_graph([4], extra_output=True)
    pruning = PruneLmHeadPass()
    assert pruning(model).modified
    assert [node.name for node in pruning.tail] == ["bias"]
    projected = next(value for value in model.graph.outputs if value.name == "projected")
    assert str(projected.shape[1]) == "sequence_length"
    hidden = np.random.default_rng(2).standard_normal((2, 5, 8)).astype(np.float32)
    logits, full = _run_head(model, tmp_path, hidden)
    assert full.shape == (2, 5, 4)
    bias = model.graph.initializers["C"].const_value.numpy()
    np.testing.assert_allclose(logits[:, 0], full[:, -1] + bias, atol=TOLERANCE, rtol=0)


def test_without_attention_mask_the_graph_is_left_alone():
    model = _head_graph([4], inputs=False)
    pruning = PruneLmHeadPass()
    assert not pruning(model).modified
    assert "attention_mask" in pruning.kept[0]


def test_logits_with_one_static_position_are_left_alone():
    model = _head_graph([4])
    logits = model.graph.outputs[0]
    logits.shape = ir.Shape([ir.SymbolicDim("batch_size"), 1, 4])
    pruning = PruneLmHeadPass()
    assert not pruning(model).modified
    assert pruning.kept == ["'logits' already has 1 position(s)"]
