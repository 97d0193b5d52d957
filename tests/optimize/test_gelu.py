"""GeluFusion (decomposed erf / tanh GELU → standard Gelu): graph checks and ORT."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from mobius_genai.optimize.rules import gelu
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

# The core of each form, ending in `cdf` = 1 + erf(...) or 1 + tanh(...). Operand orders of the
# commutative ops are written as "a, b" and swapped by _swap for the mirrored variant.
CORES = {
    "erf-div": """
        root2 = Constant<value = {t} {{1.4142135}}>()
        scaled = Div(x, root2)
        e = Erf(scaled)
        cdf = Add(e, one)""",
    "erf-mul": """
        inv_root2 = Constant<value = {t} {{0.70710678}}>()
        scaled = Mul(x, inv_root2)
        e = Erf(scaled)
        cdf = Add(e, one)""",
    "tanh-pow": """
        three = Constant<value = {t} {{3.0}}>()
        cube = Pow(x, three)
        c = Constant<value = {t} {{0.044715}}>()
        cc = Mul(c, cube)
        inner = Add(x, cc)
        k = Constant<value = {t} {{0.7978845608}}>()
        ki = Mul(k, inner)
        th = Tanh(ki)
        cdf = Add(th, one)""",
    "tanh-cube": """
        xx = Mul(x, x)
        cube = Mul(xx, x)
        c = Constant<value = {t} {{0.044715}}>()
        cc = Mul(c, cube)
        inner = Add(x, cc)
        k = Constant<value = {t} {{0.7978845608}}>()
        ki = Mul(k, inner)
        th = Tanh(ki)
        cdf = Add(th, one)""",
}
LAYOUTS = {
    "half_x": "hx = Mul(x, half)\n        y = Mul(hx, cdf)",
    "half_cdf": "hc = Mul(half, cdf)\n        y = Mul(x, hc)",
    "half_last": "xc = Mul(x, cdf)\n        y = Mul(xc, half)",
}


def _swap(text: str) -> str:
    """Mirror the operands of every Add and Mul (Pow and Div are not commutative)."""
    lines = []
    for line in text.splitlines():
        for op in ("Add(", "Mul("):
            if op in line:
                head, args = line.split(op)
                a, b = args.rstrip(")").split(", ")
                line = f"{head}{op}{b}, {a})"
        lines.append(line)
    return "\n".join(lines)


def _graph(form: str, layout: str, swapped: bool = False, dtype: str = "float") -> str:
    body = f"""
        half = Constant<value = {dtype} {{0.5}}>()
        one = Constant<value = {dtype} {{1.0}}>()
        {CORES[form].format(t=dtype)}
        {LAYOUTS[layout]}"""
    if swapped:
        body = _swap(body)
    return f"agraph ({dtype}[2,6] x) => ({dtype}[2,6] y) {{{body}\n}}"


@pytest.mark.parametrize("swapped", [False, True], ids=["ordered", "mirrored"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("form", list(CORES))
def test_every_arrangement_becomes_one_gelu(form, layout, swapped):
    model = parse(_graph(form, layout, swapped))
    assert rewrite(model, gelu.rules()) == 1
    assert op_counts(model) == {"Gelu": 1}
    (node,) = model.graph
    expected = "tanh" if form.startswith("tanh") else "none"
    assert node.attributes.get_string("approximate", "none") == expected
    assert node.inputs[0].name == "x"


def _as_float16(model: ir.Model) -> ir.Model:
    """The same graph in float16: constants rounded to float16, x and y retyped."""
    for node in model.graph:
        if node.op_type == "Constant":
            value = node.attributes["value"].as_tensor().numpy().astype(np.float16)
            node.attributes["value"] = ir.AttrTensor("value", ir.tensor(value))
    for value in [*model.graph.inputs, *model.graph.outputs]:
        value.dtype = ir.DataType.FLOAT16
    return model


@pytest.mark.parametrize("form", list(CORES))
def test_float16_constants_rounded_by_the_dtype_still_match(form):
    model = _as_float16(parse(_graph(form, "half_cdf", swapped=True)))
    assert rewrite(model, gelu.rules()) == 1
    assert op_counts(model) == {"Gelu": 1}


def test_constants_of_shape_one_match_like_scalars():
    model = parse(_graph("erf-div", "half_last").replace("float {", "float[1] {"))
    assert rewrite(model, gelu.rules()) == 1


@pytest.mark.parametrize(
    "text",
    [
        _graph("erf-div", "half_x").replace("{0.5}", "{0.6}"),
        _graph("erf-mul", "half_x").replace("{0.70710678}", "{0.8}"),
        _graph("tanh-pow", "half_cdf").replace("{3.0}", "{2.0}"),
        _graph("tanh-cube", "half_last").replace("{0.044715}", "{0.05}"),
    ],
    ids=["half", "inverse-root-2", "exponent", "coefficient"],
)
def test_a_chain_with_another_constant_is_not_gelu(text):
    model = parse(text)
    assert rewrite(model, gelu.rules()) == 0
    assert "Gelu" not in op_counts(model)


def test_declines_before_opset_20_which_has_no_gelu():
    model = parse(_graph("erf-div", "half_x"), header='<ir_version: 8, opset_import: ["" : 18]>')
    assert any("has no Gelu" in r for r in decline_reasons(model, gelu.rules()))
    assert rewrite(model, gelu.rules()) == 0


def test_a_tensor_in_a_constant_position_is_refused_without_being_read():
    # A lazily loaded weight where 0.5 belongs: refused by its size, never loaded.
    model = parse(_graph("erf-div", "half_x"))
    reads = []
    array = np.full((2, 6), 0.5, np.float32)

    def load() -> ir.TensorProtocol:
        reads.append(1)
        return ir.Tensor(array)

    weight = ir.Value(name="w", shape=ir.Shape([2, 6]), type=ir.TensorType(ir.DataType.FLOAT))
    weight.const_value = ir.LazyTensor(load, dtype=ir.DataType.FLOAT, shape=ir.Shape([2, 6]))
    model.graph.register_initializer(weight)
    (half_node,) = [n for n in model.graph if n.outputs[0].name == "half"]
    half_node.outputs[0].replace_all_uses_with(weight)
    assert rewrite(model, gelu.rules()) == 0
    assert reads == []


@pytest.mark.parametrize("form", list(CORES))
def test_ort_outputs_agree_before_and_after(form):
    model = parse(_graph(form, "half_x"))
    feeds = {"x": 3 * random_feeds(model)["x"]}
    before = run(model, feeds)
    fused = clone(model)
    assert rewrite(fused, gelu.rules()) == 1
    np.testing.assert_allclose(run(fused, feeds)[0], before[0], atol=TOLERANCE, rtol=0)
