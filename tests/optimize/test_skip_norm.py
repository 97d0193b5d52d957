"""SkipNorm (Add + RMSNormalization → SkipSimplifiedLayerNormalization): graph checks and ORT."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.rules import skip_norm
from tests.optimize._graphs import (
    clone,
    decline_reasons,
    op_counts,
    parse,
    random_feeds,
    rewrite,
    run,
    tiny_config,
    tiny_decoder,
)

TOLERANCE = 1e-5  # f32, max abs diff of every output before vs after

RESIDUAL = """
agraph (float[B,5,8] x, float[B,5,8] skip, float[8] gamma) => (float[B,5,8] y, float[B,5,8] s) {
    s = Add(x, skip)
    y = RMSNormalization<axis=-1, epsilon=0.001>(s, gamma)
}
"""


def test_add_and_rms_norm_become_one_node_that_also_returns_the_sum():
    model = parse(RESIDUAL)
    assert rewrite(model, skip_norm.rules()) == 1
    (node,) = model.graph
    assert (node.domain, node.op_type) == (MS_DOMAIN, "SkipSimplifiedLayerNormalization")
    assert node.attributes.get_float("epsilon") == pytest.approx(0.001)
    # The norm is output 0 and the sum (read by the residual path) output 3.
    assert model.graph.outputs[0] is node.outputs[0]
    assert model.graph.outputs[1] is node.outputs[3]
    # The body is registered, so a runtime without the kernel can expand it.
    assert (MS_DOMAIN, "SkipSimplifiedLayerNormalization", "") in model.functions


def test_epsilon_default_of_rms_normalization_is_carried_over():
    model = parse(RESIDUAL.replace("<axis=-1, epsilon=0.001>", ""))
    rewrite(model, skip_norm.rules())
    # RMSNormalization defaults to 1e-5; the fused op's own default (1e-12) must not apply.
    assert next(iter(model.graph)).attributes.get_float("epsilon") == pytest.approx(1e-5)


def test_a_three_layer_decoder_gets_two_per_layer_minus_the_first_input_norm_plus_final():
    model, _ = tiny_decoder(tiny_config(num_hidden_layers=3), weights="none")
    assert rewrite(model, skip_norm.rules()) == 6
    counts = op_counts(model)
    assert counts["SkipSimplifiedLayerNormalization"] == 6
    # Only layer 0's input_layernorm reads the embedding directly.
    assert counts["RMSNormalization"] == 1
    (remaining,) = [n for n in model.graph if n.op_type == "RMSNormalization"]
    assert "layers.0.input_layernorm" in remaining.inputs[1].name
    # Cross-layer fusions keep the residual: their sum output feeds the next layer's Add.
    sums_read = [n for n in model.graph if n.op_type.startswith("Skip") and n.outputs[3].uses()]
    assert len(sums_read) == 5  # the last one feeds only the final norm


@pytest.mark.parametrize(
    ("graph", "reason"),
    [
        (RESIDUAL.replace("float[B,5,8] skip", "float[8] skip"), "provably equal shapes"),
        (RESIDUAL.replace("float[B,5,8] skip", "float[C,5,8] skip"), "provably equal shapes"),
        (RESIDUAL.replace("axis=-1", "axis=1"), "not the last axis"),
        (RESIDUAL.replace("axis=-1", "axis=-1, stash_type=10"), "stash_type=10"),
        (RESIDUAL.replace("float[8] gamma", "float[5,8] gamma"), "gamma"),
    ],
    ids=["broadcast-skip", "unrelated-dims", "axis", "stash-type", "gamma-2d"],
)
def test_declines_with_a_reason_when_the_fused_op_would_compute_something_else(graph, reason):
    model = parse(graph)
    reasons = decline_reasons(model, skip_norm.rules())
    assert any(reason in r for r in reasons), reasons
    assert rewrite(model, skip_norm.rules()) == 0
    assert "SkipSimplifiedLayerNormalization" not in op_counts(model)


def test_ort_outputs_agree_before_and_after():
    model = parse(RESIDUAL.replace("B", "2"))
    feeds = random_feeds(model)
    before = run(model, feeds)
    fused = clone(model)
    assert rewrite(fused, skip_norm.rules()) == 1
    after = run(fused, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, atol=TOLERANCE, rtol=0)
