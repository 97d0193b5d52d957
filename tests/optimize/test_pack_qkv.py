"""PackQKV: graph-level checks (lazy weights, no weights) and ORT CPU before/after (f32)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from mobius_genai.optimize.rules import gqa, pack_qkv
from tests.optimize._graphs import (
    apply,
    clone,
    decline_reasons,
    max_diff,
    nodes,
    op_counts,
    run_decoder,
    tiny_config,
    tiny_decoder,
)

TOLERANCE = 1e-4  # f32 logits, max abs diff before vs after, prefill + 4 decode steps


def _packed(config, weights="memory"):
    model, counter = tiny_decoder(config, weights=weights)
    apply(model, gqa.rules())
    reads_before = counter.reads
    apply(model, pack_qkv.rules())
    return model, counter, reads_before


@pytest.mark.parametrize("bias", [False, True])
def test_three_projections_become_one_packed_matmul(bias):
    config = tiny_config(qkv_bias=bias)
    model, _, _ = _packed(config)
    counts = op_counts(model)
    assert counts["GroupQueryAttention"] == 2
    assert counts["MatMul"] == 2 * (1 + 1 + 3) + 1  # qkv, o, mlp per layer; lm_head
    for layer, node in enumerate(nodes(model, "GroupQueryAttention")):
        assert node.inputs[gqa.KEY] is None and node.inputs[gqa.VALUE] is None
        assert node.attributes.get_int("do_rotary") == 1  # attributes carried over
        packed = node.inputs[gqa.QUERY].producer()
        if bias:
            assert packed.op_type == "Add"
            b = packed.inputs[1]
            assert b.name == f"model.layers.{layer}.self_attn.qkv_proj.bias"
            assert list(b.shape) == [64 + 2 * 32]
            packed = packed.inputs[0].producer()
        assert packed.op_type == "MatMul"
        w = packed.inputs[1]
        assert w.is_initializer()
        assert w.name == f"model.layers.{layer}.self_attn.qkv_proj.weight"
        assert list(w.shape) == [64, 64 + 2 * 32]


def test_packed_weight_is_lazy_and_equals_the_concatenation():
    config = tiny_config(qkv_bias=True)
    model, counter, reads_before = _packed(config, weights="lazy")
    assert counter.reads == reads_before  # nothing read while rewriting
    graph = model.graph
    w = graph.initializers["model.layers.0.self_attn.qkv_proj.weight"]
    assert isinstance(w.const_value, ir.LazyTensor)
    # The originals are unused now; rebuild them from a fresh copy to compare values.
    fresh, _ = tiny_decoder(config, weights="memory")
    parts = [
        fresh.graph.initializers[f"model.layers.0.self_attn.{p}_proj.weight"].const_value.numpy()
        for p in "qkv"
    ]
    np.testing.assert_array_equal(w.const_value.numpy(), np.concatenate(parts, axis=1))
    b = graph.initializers["model.layers.0.self_attn.qkv_proj.bias"]
    biases = [
        fresh.graph.initializers[f"model.layers.0.self_attn.{p}_proj.bias"].const_value.numpy()
        for p in "qkv"
    ]
    np.testing.assert_array_equal(b.const_value.numpy(), np.concatenate(biases))


def test_without_weights_the_packed_parameter_has_no_value():
    model, _, _ = _packed(tiny_config(qkv_bias=True), weights="none")
    w = model.graph.initializers["model.layers.0.self_attn.qkv_proj.weight"]
    b = model.graph.initializers["model.layers.0.self_attn.qkv_proj.bias"]
    assert w.const_value is None and b.const_value is None
    assert list(w.shape) == [64, 128] and w.dtype == ir.DataType.FLOAT
    assert list(b.shape) == [128]


def test_qk_norm_projections_are_not_packed():
    """q and k pass through RMSNorm before GQA, so there is nothing to pack."""
    model, _, _ = _packed(tiny_config(qk_norm=True, head_dim=32))
    for node in nodes(model, "GroupQueryAttention"):
        assert node.inputs[gqa.KEY] is not None


def test_declines_weights_that_are_not_initializers():
    config = tiny_config()
    model, _ = tiny_decoder(config)
    apply(model, gqa.rules())
    value = model.graph.initializers.pop("model.layers.0.self_attn.k_proj.weight")
    model.graph.inputs.append(value)  # a weight fed at run time cannot be concatenated
    reasons = decline_reasons(model, pack_qkv.rules())
    assert any("2-D initializer" in reason for reason in reasons)
    apply(model, pack_qkv.rules())
    unpacked = [n for n in nodes(model, "GroupQueryAttention") if n.inputs[gqa.KEY] is not None]
    assert len(unpacked) == 1


@pytest.mark.parametrize("bias", [False, True])
def test_rewritten_model_runs_with_ort(bias, tmp_path):
    config = tiny_config(qkv_bias=bias, num_hidden_layers=2)
    model, _ = tiny_decoder(config)
    apply(model, gqa.rules())
    before = run_decoder(model, config, tmp_path / "before")
    packed = clone(model)
    apply(packed, pack_qkv.rules())
    assert all(n.inputs[gqa.KEY] is None for n in nodes(packed, "GroupQueryAttention"))
    after = run_decoder(packed, config, tmp_path / "after")
    assert max_diff(before, after) <= TOLERANCE
