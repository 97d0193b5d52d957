"""GQAFusion: graph-level checks (no ORT) and ORT CPU runs before/after the rewrite (f32)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from mobius_genai.components.attention import SLIDING_WINDOW_KEY
from mobius_genai.config import RopeConfig
from mobius_genai.optimize import optimize_model
from mobius_genai.optimize.rules import gqa
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


def _fused(config, **kwargs) -> ir.Model:
    model, _ = tiny_decoder(config, **kwargs)
    apply(model, gqa.rules())
    return model


def _drop_rotary(model: ir.Model) -> None:
    """Make every layer a layer without rotary embedding (q and k used as projected)."""
    for node in nodes(model, "RotaryEmbedding"):
        node.outputs[0].replace_all_uses_with(node.inputs[0])
        model.graph.remove(node, safe=True)


# ---------------------------------------------------------------- graph level


def test_every_layer_becomes_one_gqa_with_fused_rotary():
    config = tiny_config(num_hidden_layers=3)
    model = _fused(config)
    counts = op_counts(model)
    assert counts["GroupQueryAttention"] == 3
    assert counts["Attention"] == 0 and counts["RotaryEmbedding"] == 0
    assert counts["Where"] == 0  # the mask subgraph is dead and gone
    for node in nodes(model, "GroupQueryAttention"):
        assert node.domain == "com.microsoft"
        attrs = node.attributes
        assert attrs.get_int("num_heads") == 4 and attrs.get_int("kv_num_heads") == 2
        assert attrs.get_int("do_rotary") == 1 and attrs.get_int("rotary_interleaved") == 0
        assert attrs.get_float("scale") == pytest.approx(0.25)
        assert "local_window_size" not in attrs and "softcap" not in attrs
        assert node.inputs[gqa.QUERY].producer().op_type == "MatMul"  # the unrotated q
        assert node.inputs[gqa.COS_CACHE].name.endswith("cos_cache")
        assert node.inputs[gqa.SIN_CACHE].name.endswith("sin_cache")
        assert node.inputs[gqa.PAST_KEY].name.startswith("past_key_values.")


def test_sequence_lengths_are_derived_once_from_attention_mask():
    model = _fused(tiny_config(num_hidden_layers=3))
    gqas = nodes(model, "GroupQueryAttention")
    assert len({id(n.inputs[gqa.SEQLENS_K]) for n in gqas}) == 1
    assert len({id(n.inputs[gqa.TOTAL_SEQ_LEN]) for n in gqas}) == 1
    seqlens_k = gqas[0].inputs[gqa.SEQLENS_K]
    total = gqas[0].inputs[gqa.TOTAL_SEQ_LEN]
    assert seqlens_k.producer().attributes.get_int("to") == ir.DataType.INT32
    assert total.producer().attributes.get_int("to") == ir.DataType.INT32
    assert op_counts(model)["ReduceSum"] == 1
    (reduce_sum,) = nodes(model, "ReduceSum")
    assert reduce_sum.inputs[0].name == "attention_mask"
    (shape,) = nodes(model, "Shape")
    assert shape.inputs[0].name == "attention_mask"
    assert shape.attributes.get_int("start") == 1 and shape.attributes.get_int("end") == 2
    # position_ids is now read by nothing: the pipeline's last stage drops the input.
    position_ids = next(v for v in model.graph.inputs if v.name == "position_ids")
    assert not position_ids.uses()


def test_sliding_window_becomes_local_window_size_per_layer():
    config = tiny_config(
        num_hidden_layers=2, sliding_window=5, layer_types=("sliding_attention", "full_attention")
    )
    first, second = nodes(_fused(config), "GroupQueryAttention")
    assert first.attributes.get_int("local_window_size") == 5  # query i sees j when i - j < 5
    assert "local_window_size" not in second.attributes


def test_scale_softcap_and_interleaving_are_carried_over():
    config = tiny_config(
        attention_scale=0.1, attn_logit_softcapping=2.0, rope=RopeConfig(interleaved=True)
    )
    for node in nodes(_fused(config), "GroupQueryAttention"):
        assert node.attributes.get_float("scale") == pytest.approx(0.1)
        assert node.attributes.get_float("softcap") == pytest.approx(2.0)
        assert node.attributes.get_int("rotary_interleaved") == 1


def test_qk_norm_stays_in_front_of_gqa():
    config = tiny_config(qk_norm=True, head_dim=32, qkv_bias=True)
    model = _fused(config)
    assert op_counts(model)["RMSNormalization"] == 2 * 2 + 2 * 2 + 1  # q/k norms kept
    for node in nodes(model, "GroupQueryAttention"):
        assert node.attributes.get_int("do_rotary") == 1
        reshape = node.inputs[gqa.QUERY].producer()
        assert reshape.op_type == "Reshape"
        assert reshape.inputs[0].producer().op_type == "RMSNormalization"


def test_partial_rotary_moves_into_gqa_when_its_tables_allow():
    config = tiny_config(
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        rope=RopeConfig(partial_rotary_factor=0.5),
    )
    for node in nodes(_fused(config), "GroupQueryAttention"):
        assert node.attributes.get_int("do_rotary") == 1
        assert list(node.inputs[gqa.COS_CACHE].shape) == [64, 16]  # rotates 32 of 64


def test_partial_rotary_gqa_cannot_express_stays_explicit():
    config = tiny_config(rope=RopeConfig(partial_rotary_factor=0.5))  # tables 4 wide
    model, _ = tiny_decoder(config)
    reasons = decline_reasons(model, gqa.rules())
    assert any("GQA needs a multiple of 8" in reason for reason in reasons)
    apply(model, gqa.rules())
    counts = op_counts(model)
    assert counts["GroupQueryAttention"] == 2 and counts["RotaryEmbedding"] == 4
    for node in nodes(model, "GroupQueryAttention"):
        assert node.attributes.get_int("do_rotary", 0) == 0
        assert len(node.inputs) == gqa.TOTAL_SEQ_LEN + 1  # no cos/sin caches


def test_layers_without_rotary_fuse_with_do_rotary_0():
    model, _ = tiny_decoder(tiny_config())
    _drop_rotary(model)
    apply(model, gqa.rules())
    gqas = nodes(model, "GroupQueryAttention")
    assert len(gqas) == 2
    for node in gqas:
        assert node.attributes.get_int("do_rotary", 0) == 0
        assert node.inputs[gqa.QUERY].producer().op_type == "MatMul"


def test_positions_other_than_the_graph_input_keep_rotary_explicit():
    model, _ = tiny_decoder(tiny_config())
    position_ids = next(v for v in model.graph.inputs if v.name == "position_ids")
    shifted = ir.node("Add", [position_ids, ir.Value(name="zero")])
    shifted.inputs[1].const_value = ir.tensor(np.array(0, np.int64))
    model.graph.register_initializer(shifted.inputs[1])
    model.graph.insert_before(next(iter(model.graph)), shifted)
    for node in nodes(model, "RotaryEmbedding"):
        node.replace_input_with(3, shifted.outputs[0])
    assert any("'position_ids' graph input" in r for r in decline_reasons(model, gqa.rules()))
    apply(model, gqa.rules())
    assert op_counts(model)["RotaryEmbedding"] == 4
    assert all(
        n.attributes.get_int("do_rotary", 0) == 0 for n in nodes(model, "GroupQueryAttention")
    )


def test_declines_when_mask_window_and_metadata_disagree():
    config = tiny_config(sliding_window=5, layer_types=("sliding_attention",) * 2)
    model, _ = tiny_decoder(config)
    for node in nodes(model, "Attention"):
        node.metadata_props[SLIDING_WINDOW_KEY] = "7"
    assert any("disagrees" in reason for reason in decline_reasons(model, gqa.rules()))
    apply(model, gqa.rules())
    assert op_counts(model)["GroupQueryAttention"] == 0


def test_declines_when_the_bias_is_not_the_attention_mask_mask():
    model, _ = tiny_decoder(tiny_config())
    custom = ir.Value(
        name="custom_bias",
        type=ir.TensorType(ir.DataType.FLOAT),
        shape=ir.Shape(["batch_size", 1, "sequence_length", "total_sequence_length"]),
    )
    model.graph.inputs.append(custom)
    for node in nodes(model, "Attention"):
        node.replace_input_with(3, custom)
    assert any("masks.py" in reason for reason in decline_reasons(model, gqa.rules()))
    apply(model, gqa.rules())
    assert op_counts(model)["GroupQueryAttention"] == 0


def test_declines_head_dim_gqa_cannot_run():
    model, _ = tiny_decoder(tiny_config(head_dim=12))
    assert any("multiple of 8" in reason for reason in decline_reasons(model, gqa.rules()))
    apply(model, gqa.rules())
    assert op_counts(model)["Attention"] == 2


def test_fuses_graphs_built_without_weights():
    model, _ = tiny_decoder(tiny_config(), weights="none")
    apply(model, gqa.rules())
    assert op_counts(model)["GroupQueryAttention"] == 2


# ---------------------------------------------------------------- ORT CPU, f32

ORT_CASES = {
    "plain": {},
    "sliding_window_5_of_12": {
        "sliding_window": 5,
        "layer_types": ("sliding_attention", "full_attention"),
    },
    "qk_norm_bias_head_dim_32": {"qk_norm": True, "qkv_bias": True, "head_dim": 32},
    "interleaved": {"rope": RopeConfig(interleaved=True)},
    "scale_softcap": {"attention_scale": 0.1, "attn_logit_softcapping": 2.0},
    "partial_rotary_fused": {
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "rope": RopeConfig(partial_rotary_factor=0.5),
    },
    "partial_rotary_explicit": {"rope": RopeConfig(partial_rotary_factor=0.5)},
    "mha": {"num_key_value_heads": 4},
}


@pytest.mark.parametrize("case", sorted(ORT_CASES))
def test_rewritten_model_runs_with_ort(case, tmp_path):
    config = tiny_config(**ORT_CASES[case])
    model, _ = tiny_decoder(config)
    before = run_decoder(model, config, tmp_path / "before")
    fused = clone(model)
    apply(fused, gqa.rules())
    assert op_counts(fused)["GroupQueryAttention"] == config.num_hidden_layers
    after = run_decoder(fused, config, tmp_path / "after")
    assert max_diff(before, after) <= TOLERANCE


def test_layers_without_rotary_run_with_ort(tmp_path):
    config = tiny_config()
    model, _ = tiny_decoder(config)
    _drop_rotary(model)
    before = run_decoder(model, config, tmp_path / "before")
    apply(model, gqa.rules())
    assert op_counts(model)["GroupQueryAttention"] == 2
    after = run_decoder(model, config, tmp_path / "after")
    assert max_diff(before, after) <= TOLERANCE


def test_off_by_one_window_would_be_caught(tmp_path):
    """The window test can fail: GQA with local_window_size = window - 1 differs."""
    config = tiny_config(sliding_window=5, layer_types=("sliding_attention",) * 2)
    model, _ = tiny_decoder(config)
    before = run_decoder(model, config, tmp_path / "before")
    apply(model, gqa.rules())
    for node in nodes(model, "GroupQueryAttention"):
        node.attributes["local_window_size"] = ir.AttrInt64("local_window_size", 4)
    assert max_diff(before, run_decoder(model, config, tmp_path / "after")) > 1e-2


# ---------------------------------------------------------------- through the pipeline


def test_pipeline_reports_why_gqa_did_not_form():
    model, _ = tiny_decoder(tiny_config(head_dim=12), weights="none")
    with pytest.warns(UserWarning, match="GQA fusion expected for ep='cpu'"):
        report = optimize_model(model, "cpu", ir.DataType.FLOAT)
    reasons = {decline.reason for decline in report.rules["GQAFusion"].declines}
    assert reasons == {"head_dim 12 is not a multiple of 8, which GQA requires"}
    assert op_counts(model)["Attention"] == 2


def test_pipeline_fuses_sliding_window_layers_for_cpu_f32():
    config = tiny_config(sliding_window=5, layer_types=("sliding_attention", "full_attention"))
    model, _ = tiny_decoder(config, weights="none")
    optimize_model(model, "cpu", ir.DataType.FLOAT)
    first, second = nodes(model, "GroupQueryAttention")
    assert first.attributes.get_int("local_window_size") == 5
    assert "local_window_size" not in second.attributes
