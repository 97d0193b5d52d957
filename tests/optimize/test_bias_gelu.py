"""BiasGelu (Add(x, bias) + Gelu → com.microsoft BiasGelu / FastGelu): graph checks and ORT."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.rules import bias_gelu
from tests.optimize._graphs import (
    clone,
    decline_reasons,
    op_counts,
    parse,
    random_feeds,
    rewrite,
    run,
)

TOLERANCE = 1e-5  # f32, max abs diff before vs after

GRAPH = """
agraph (float[2,5,8] x, float[8] bias) => (float[2,5,8] y) {{
    h = Add({operands})
    y = Gelu{attributes}(h)
}}
"""


def _graph(approximate: str = "none", operands: str = "x, bias") -> str:
    attributes = "" if approximate == "none" else f'<approximate="{approximate}">'
    return GRAPH.format(operands=operands, attributes=attributes)


@pytest.mark.parametrize(
    ("approximate", "fused"), [("none", "BiasGelu"), ("tanh", "FastGelu")], ids=["erf", "tanh"]
)
@pytest.mark.parametrize("operands", ["x, bias", "bias, x"], ids=["x-first", "bias-first"])
def test_biased_gelu_becomes_the_ort_op_of_the_same_approximation(approximate, fused, operands):
    model = parse(_graph(approximate, operands))
    assert rewrite(model, bias_gelu.rules()) == 1
    (node,) = model.graph
    assert (node.domain, node.op_type) == (MS_DOMAIN, fused)
    assert [v.name for v in node.inputs] == ["x", "bias"]
    assert (MS_DOMAIN, fused, "") in model.functions


def test_declines_a_bias_that_is_not_one_vector_along_the_last_axis():
    model = parse(_graph().replace("float[8] bias", "float[5,8] bias"))
    assert any("is not a vector" in r for r in decline_reasons(model, bias_gelu.rules()))
    assert rewrite(model, bias_gelu.rules()) == 0
    assert op_counts(model) == {"Add": 1, "Gelu": 1}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_ort_outputs_agree_before_and_after(approximate):
    # Also pins the op semantics: BiasGelu is onnxruntime's exact (erf) GELU of x + bias and
    # FastGelu(x, bias) its tanh approximation; swapping them would exceed the tolerance.
    model = parse(_graph(approximate))
    feeds = random_feeds(model)
    feeds["x"] *= 3
    before = run(model, feeds)[0]
    fused = clone(model)
    assert rewrite(fused, bias_gelu.rules()) == 1
    np.testing.assert_allclose(run(fused, feeds)[0], before, atol=TOLERANCE, rtol=0)
