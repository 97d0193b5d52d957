"""Tier-1 functions: each standard-ONNX body computes what onnxruntime's kernel computes."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx_ir.passes.common import InlinePass

from mobius_genai.components.tier1 import (
    MS_DOMAIN,
    TIER1_OPS,
    DropUnusedOptionalOutputsPass,
    ep_runs,
    needs_inlining,
    register_functions,
)
from mobius_genai.ep import get_ep
from tests.optimize._graphs import clone, op_counts, parse, random_feeds, run

TOLERANCE = 1e-5  # f32, max abs diff between kernel and body
HEADER = '<ir_version: 10, opset_import: ["" : 24, "com.microsoft" : 1]>'
EPSILON = 0.01

CALLS = {
    "SkipSimplifiedLayerNormalization": """
        agraph (float[2,5,8] x, float[2,5,8] skip, float[8] gamma)
                => (float[2,5,8] y, float[2,5,1] mean, float[2,5,1] inv, float[2,5,8] s) {
            y, mean, inv, s = com.microsoft.SkipSimplifiedLayerNormalization<epsilon=0.01>(
                x, skip, gamma)
        }""",
    "SkipLayerNormalization": """
        agraph (float[2,5,8] x, float[2,5,8] skip, float[8] gamma, float[8] beta)
                => (float[2,5,8] y, float[2,5,1] mean, float[2,5,1] inv, float[2,5,8] s) {
            y, mean, inv, s = com.microsoft.SkipLayerNormalization<epsilon=0.01>(
                x, skip, gamma, beta)
        }""",
    "BiasGelu": """
        agraph (float[2,5,8] a, float[8] b) => (float[2,5,8] y) {
            y = com.microsoft.BiasGelu(a, b)
        }""",
    "FastGelu": """
        agraph (float[2,5,8] a, float[8] b) => (float[2,5,8] y) {
            y = com.microsoft.FastGelu(a, b)
        }""",
}
# The kernels leave the statistics outputs unwritten; the bodies define them (see functions.py).
STATISTICS = ("mean", "inv")


def _statistics(feeds: dict[str, np.ndarray], simplified: bool) -> dict[str, np.ndarray]:
    total = (feeds["x"] + feeds["skip"]).astype(np.float64)
    mean = total.mean(axis=-1, keepdims=True)
    spread = (total**2).mean(axis=-1, keepdims=True)
    if not simplified:
        spread = spread - mean**2
    return {"mean": mean, "inv": 1 / np.sqrt(spread + EPSILON)}


@pytest.mark.parametrize("op_type", list(CALLS))
def test_body_agrees_with_the_onnxruntime_kernel(op_type):
    model = parse(CALLS[op_type], header=HEADER)
    assert register_functions(model) == [(MS_DOMAIN, op_type, "")]
    feeds = random_feeds(model)
    names = [v.name for v in model.graph.outputs]

    kernel = clone(model)
    for value in [v for v in kernel.graph.outputs if v.name in STATISTICS]:
        kernel.graph.outputs.remove(value)
    expected = dict(zip([v.name for v in kernel.graph.outputs], run(kernel, feeds), strict=True))

    expanded = clone(model)
    InlinePass()(expanded)
    assert all(node.domain == "" for node in expanded.graph)
    onnx.checker.check_model(ir.to_proto(expanded), full_check=True)
    got = dict(zip(names, run(expanded, feeds), strict=True))
    if "mean" in names:
        expected.update(_statistics(feeds, simplified="Simplified" in op_type))
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=TOLERANCE, rtol=0, err_msg=name)


@pytest.mark.parametrize("overload", ["transA", "transB"])
def test_fused_matmul_overload_bodies_agree_with_the_kernel(overload):
    a_shape, b_shape = ("[8,5]", "[8,3]") if overload == "transA" else ("[5,8]", "[3,8]")
    model = parse(
        f"""agraph (float{a_shape} a, float{b_shape} b) => (float[5,3] y) {{
            y = com.microsoft.FusedMatMul<{overload}=1>(a, b)
        }}""",
        header=HEADER,
    )
    next(iter(model.graph)).overload = overload
    assert register_functions(model) == [(MS_DOMAIN, "FusedMatMul", overload)]
    feeds = random_feeds(model)
    expected = run(model, feeds)[0]
    InlinePass()(model)
    assert op_counts(model) == {"Transpose": 1, "MatMul": 1}
    np.testing.assert_allclose(run(model, feeds)[0], expected, atol=TOLERANCE, rtol=0)


def test_calls_no_body_covers_get_none():
    model = parse(
        """agraph (float[2,8] a, float[8] b, float[2,8] x, float[2,8] s, float[8] g)
                => (float[2,8] y, float[2,8] z, float[2,8] w) {
            y = com.microsoft.FastGelu(a)
            z = com.microsoft.FusedMatMul<alpha=2.0>(a, x)
            w = com.microsoft.SkipSimplifiedLayerNormalization(x, s, g, b)
        }""",
        header=HEADER,
    )
    assert register_functions(model) == []
    assert not model.functions


def test_bodies_use_the_models_onnx_opset():
    model = parse(CALLS["BiasGelu"], header=HEADER.replace('"" : 24', '"" : 22'))
    register_functions(model)
    (function,) = model.functions.values()
    assert function.opset_imports == {"": 22}


def test_unread_optional_outputs_are_left_unnamed_but_the_call_keeps_its_arity():
    model = parse(
        """agraph (float[2,5,8] x, float[2,5,8] skip, float[8] gamma) => (float[2,5,8] y) {
            y, mean, inv, s = com.microsoft.SkipSimplifiedLayerNormalization(x, skip, gamma)
        }""",
        header=HEADER,
    )
    assert DropUnusedOptionalOutputsPass()(model).modified
    (node,) = model.graph
    assert [v.name for v in node.outputs] == ["y", "", "", "s"]
    assert len(ir.to_proto(model).graph.node[0].output) == 4


def test_capability_fields_decide_which_ops_run_and_which_bodies_expand():
    default, trt, standard = get_ep("default"), get_ep("trt-rtx"), get_ep("onnx-standard")
    # PackedMultiHeadAttention is CUDA's only: onnxruntime's CPU provider has no kernel and does
    # not fall back to the body, so even the portable "default" gets the body inlined
    packed = "PackedMultiHeadAttention"
    assert all(ep_runs(default, op) for op in TIER1_OPS if op not in (packed, "QMoE"))
    assert not ep_runs(default, packed) and ep_runs(get_ep("cuda"), packed)
    # QMoE is the CPU provider's (its bodies are GeGLU overloads no kernel takes)
    assert not ep_runs(default, "QMoE") and ep_runs(get_ep("cpu"), "QMoE")
    assert not ep_runs(trt, "SkipSimplifiedLayerNormalization")
    assert ep_runs(trt, "FusedMatMul") and ep_runs(trt, "BiasGelu")
    assert not any(ep_runs(standard, op) for op in TIER1_OPS)
    no_fused_matmul = dataclasses.replace(default, name="no-fmm", supports_fused_matmul=False)
    skip = TIER1_OPS["SkipLayerNormalization"].function("", 24)
    matmul = TIER1_OPS["FusedMatMul"].function("transB", 24)
    assert needs_inlining(skip, trt) and not needs_inlining(matmul, trt)
    assert needs_inlining(matmul, no_fused_matmul) and not needs_inlining(skip, no_fused_matmul)
    assert needs_inlining(skip, standard) and needs_inlining(matmul, standard)
