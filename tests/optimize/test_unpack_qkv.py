"""UnpackQKV: graph-level checks (lazy slices, no weights) and ORT CPU before/after (f32)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from mobius_genai.optimize.rules import gqa, pack_qkv, unpack_qkv
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
    apply(model, gqa.rules(), pack_qkv.rules())
    return model, counter


@pytest.mark.parametrize("bias", [False, True])
def test_packed_projection_becomes_three(bias):
    model, _ = _packed(tiny_config(qkv_bias=bias))
    apply(model, unpack_qkv.rules())
    assert op_counts(model)["MatMul"] == 2 * (3 + 1 + 3) + 1
    for layer, node in enumerate(nodes(model, "GroupQueryAttention")):
        assert node.attributes.get_int("do_rotary") == 1  # attributes carried over
        widths = []
        for index, part in zip((gqa.QUERY, gqa.KEY, gqa.VALUE), "qkv", strict=True):
            producer = node.inputs[index].producer()
            if bias:
                assert producer.op_type == "Add"
                assert producer.inputs[1].name == f"model.layers.{layer}.self_attn.{part}_proj.bias"
                producer = producer.inputs[0].producer()
            assert producer.op_type == "MatMul"
            weight = producer.inputs[1]
            assert weight.name == f"model.layers.{layer}.self_attn.{part}_proj.weight"
            widths.append(weight.shape[1])
        assert widths == [64, 32, 32]


def test_slices_are_lazy_and_equal_the_original_projections():
    config = tiny_config(qkv_bias=True)
    model, counter = _packed(config, weights="lazy")
    reads = counter.reads
    apply(model, unpack_qkv.rules())
    assert counter.reads == reads  # nothing read while rewriting
    original, _ = tiny_decoder(config, weights="memory")
    for part in "qkv":
        for kind in ("weight", "bias"):
            name = f"model.layers.1.self_attn.{part}_proj.{kind}"
            value = model.graph.initializers[name].const_value
            assert isinstance(value, ir.LazyTensor)
            expected = original.graph.initializers[name].const_value.numpy()
            np.testing.assert_array_equal(value.numpy(), expected)


def test_without_weights_the_parts_have_no_values():
    model, _ = _packed(tiny_config(qkv_bias=True), weights="none")
    apply(model, unpack_qkv.rules())
    for part, width in zip("qkv", (64, 32, 32), strict=True):
        weight = model.graph.initializers[f"model.layers.0.self_attn.{part}_proj.weight"]
        assert weight.const_value is None and list(weight.shape) == [64, width]


def test_declines_a_width_that_does_not_split_into_heads():
    model, _ = _packed(tiny_config())
    for node in nodes(model, "GroupQueryAttention"):
        node.attributes["num_heads"] = ir.AttrInt64("num_heads", 3)  # 128 % (3 + 4) != 0
    reasons = decline_reasons(model, unpack_qkv.rules())
    assert any("(num_heads + 2 * kv_num_heads) * head_dim" in reason for reason in reasons)


def test_unpacked_gqa_is_left_alone():
    model, _ = tiny_decoder(tiny_config())
    apply(model, gqa.rules())
    assert apply(model, unpack_qkv.rules()) == [0]


@pytest.mark.parametrize("bias", [False, True])
def test_rewritten_model_runs_with_ort(bias, tmp_path):
    config = tiny_config(qkv_bias=bias)
    model, _ = _packed(config)
    before = run_decoder(model, config, tmp_path / "before")
    unpacked = clone(model)
    apply(unpacked, unpack_qkv.rules())
    assert all(n.inputs[gqa.KEY] is not None for n in nodes(unpacked, "GroupQueryAttention"))
    after = run_decoder(unpacked, config, tmp_path / "after")
    assert max_diff(before, after) <= TOLERANCE
