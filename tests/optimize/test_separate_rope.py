"""SeparateRoPE: graph-level checks and ORT CPU before/after (f32), prefill and cached decode."""

from __future__ import annotations

import pytest

from mobius_genai.config import RopeConfig
from mobius_genai.optimize.rules import gqa, pack_qkv, separate_rope
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


def _fused(config):
    model, _ = tiny_decoder(config)
    apply(model, gqa.rules())
    return model


def test_rotation_moves_in_front_of_gqa():
    model = _fused(tiny_config(rope=RopeConfig(interleaved=True)))
    apply(model, separate_rope.rules())
    counts = op_counts(model)
    assert counts["GroupQueryAttention"] == 2 and counts["RotaryEmbedding"] == 4
    for node in nodes(model, "GroupQueryAttention"):
        assert node.attributes.get_int("do_rotary") == 0
        assert "rotary_interleaved" not in node.attributes
        assert node.attributes.get_float("scale") == pytest.approx(0.25)  # others carried over
        assert len(node.inputs) == gqa.TOTAL_SEQ_LEN + 1  # no cos/sin caches
        for index, heads in ((gqa.QUERY, 4), (gqa.KEY, 2)):
            rope = node.inputs[index].producer()
            assert rope.op_type == "RotaryEmbedding" and rope.domain == "com.microsoft"
            assert rope.attributes.get_int("num_heads") == heads
            assert rope.attributes.get_int("rotary_embedding_dim") == 16
            assert rope.attributes.get_int("interleaved") == 1
            assert rope.inputs[2].name.endswith("cos_cache")
            assert rope.inputs[3].name.endswith("sin_cache")
            assert rope.inputs[1].name == "position_ids" and rope.inputs[1].is_graph_input()


def test_gqa_without_rotation_is_left_alone():
    model, _ = tiny_decoder(tiny_config(rope=RopeConfig(partial_rotary_factor=0.5)))
    apply(model, gqa.rules())  # tables too narrow for GQA: fused with do_rotary=0
    assert decline_reasons(model, separate_rope.rules()) == []  # not even a candidate
    assert apply(model, separate_rope.rules()) == [0]


def test_declines_without_a_position_ids_input():
    model = _fused(tiny_config())
    position_ids = next(v for v in model.graph.inputs if v.name == "position_ids")
    model.graph.inputs.remove(position_ids)  # as after the pipeline dropped it
    reasons = decline_reasons(model, separate_rope.rules())
    assert any("no 'position_ids' graph input" in reason for reason in reasons)
    assert apply(model, separate_rope.rules()) == [0]


ORT_CASES = {
    "plain": {},
    "sliding_window_qk_norm": {
        "sliding_window": 5,
        "layer_types": ("sliding_attention", "full_attention"),
        "qk_norm": True,
        "head_dim": 32,
    },
    "interleaved": {"rope": RopeConfig(interleaved=True)},
    "partial_rotary": {
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "rope": RopeConfig(partial_rotary_factor=0.5),
    },
}


@pytest.mark.parametrize("case", sorted(ORT_CASES))
def test_rewritten_model_runs_with_ort(case, tmp_path):
    config = tiny_config(**ORT_CASES[case])
    model = _fused(config)
    before = run_decoder(model, config, tmp_path / "before")
    separated = clone(model)
    apply(separated, separate_rope.rules())
    assert op_counts(separated)["RotaryEmbedding"] == 2 * config.num_hidden_layers
    after = run_decoder(separated, config, tmp_path / "after")
    assert max_diff(before, after) <= TOLERANCE


def test_declines_packed_qkv_naming_unpack():
    model = _fused(tiny_config())
    apply(model, pack_qkv.rules())
    reasons = decline_reasons(model, separate_rope.rules())
    assert reasons and all("UnpackQKV has to run first" in reason for reason in reasons)
    assert apply(model, separate_rope.rules()) == [0]
