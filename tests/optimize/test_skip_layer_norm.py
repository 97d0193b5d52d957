"""SkipLayerNorm (Add + LayerNormalization → SkipLayerNormalization): graph checks and ORT."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.rules import skip_layer_norm
from tests.optimize._graphs import (
    clone,
    decline_reasons,
    op_counts,
    parse,
    random_feeds,
    rewrite,
    run,
)

TOLERANCE = 1e-5  # f32, max abs diff of every output before vs after

WITH_BIAS = """
agraph (float[2,5,8] x, float[2,5,8] skip, float[8] gamma, float[8] beta)
        => (float[2,5,8] y, float[2,5,8] s) {
    s = Add(x, skip)
    y = LayerNormalization<axis=-1, epsilon=0.001>(s, gamma, beta)
}
"""

WITHOUT_BIAS = """
agraph (float[2,5,8] x, float[2,5,8] skip, float[8] gamma) => (float[2,5,8] y, float[2,5,8] s) {
    s = Add(x, skip)
    y = LayerNormalization<axis=-1>(s, gamma)
}
"""


def _fused_node(model):
    (node,) = model.graph
    assert (node.domain, node.op_type) == (MS_DOMAIN, "SkipLayerNormalization")
    return node


def test_add_and_layer_norm_with_bias_become_skip_layer_normalization():
    model = parse(WITH_BIAS)
    assert rewrite(model, skip_layer_norm.rules()) == 1
    node = _fused_node(model)
    assert [v.name for v in node.inputs] == ["x", "skip", "gamma", "beta"]
    assert node.attributes.get_float("epsilon") == pytest.approx(0.001)
    assert model.graph.outputs[1] is node.outputs[3]
    assert (MS_DOMAIN, "SkipLayerNormalization", "") in model.functions


def test_layer_norm_without_bias_maps_to_the_op_without_beta():
    model = parse(WITHOUT_BIAS)
    assert rewrite(model, skip_layer_norm.rules()) == 1
    node = _fused_node(model)
    assert len(node.inputs) == 3
    assert node.attributes.get_float("epsilon") == pytest.approx(1e-5)  # LayerNorm's default


def test_declines_a_broadcasting_skip_and_leaves_a_norm_whose_statistics_are_read():
    broadcast = parse(WITH_BIAS.replace("float[2,5,8] skip", "float[5,8] skip"))
    assert any(
        "provably equal shapes" in r for r in decline_reasons(broadcast, skip_layer_norm.rules())
    )
    assert rewrite(broadcast, skip_layer_norm.rules()) == 0

    statistics = parse(
        WITH_BIAS.replace("=> (float[2,5,8] y,", "=> (float[2,5,1] mean, float[2,5,8] y,").replace(
            "y = LayerNormalization", "y, mean = LayerNormalization"
        )
    )
    assert rewrite(statistics, skip_layer_norm.rules()) == 0
    assert op_counts(statistics)["LayerNormalization"] == 1


@pytest.mark.parametrize("graph", [WITH_BIAS, WITHOUT_BIAS], ids=["beta", "no-beta"])
def test_ort_outputs_agree_before_and_after(graph):
    model = parse(graph)
    feeds = random_feeds(model)
    before = run(model, feeds)
    fused = clone(model)
    assert rewrite(fused, skip_layer_norm.rules()) == 1
    after = run(fused, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, atol=TOLERANCE, rtol=0)
