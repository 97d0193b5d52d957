"""Tier-1 ops of recurrent layers: each standard body computes what onnxruntime's kernel and
numpy compute, on onnxruntime and on onnx's reference evaluator (portable means portable)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_ir.passes.common import InlinePass

from mobius_genai.components.tier1 import MS_DOMAIN, register_functions
from tests.optimize._graphs import clone, parse, random_feeds, run

TOLERANCE = 1e-5  # f32
HEADER = '<ir_version: 10, opset_import: ["" : 24, "com.microsoft" : 1]>'


def _conv_call(length: int, kernel: int, activation: str) -> ir.Model:
    model = parse(
        f"""agraph (float[2,6,{length}] x, float[6,1,{kernel}] w, float[2,6,{kernel - 1}] past)
                => (float[2,6,{length}] y, float[2,6,{kernel - 1}] present) {{
            y, present = com.microsoft.CausalConvWithState<activation="{activation}">(
                x, w, , past)
        }}""",
        header=HEADER,
    )
    if activation != "none":
        next(iter(model.graph)).overload = activation
    return model


def _conv_numpy(feeds: dict[str, np.ndarray], activation: str) -> tuple[np.ndarray, np.ndarray]:
    x, w, past = feeds["x"], feeds["w"], feeds["past"]
    kernel, length = w.shape[-1], x.shape[-1]
    window = np.concatenate([past, x], axis=-1).astype(np.float64)
    y = np.stack(
        [(window[:, :, t : t + kernel] * w[None, :, 0, :]).sum(-1) for t in range(length)], -1
    )
    if activation == "silu":
        y = y / (1 + np.exp(-y))
    return y, window[:, :, length:]


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize(
    ("length", "kernel"),
    [(9, 3), (1, 3), (1, 4), (2, 4)],  # prefill longer than the kernel; decode; shorter than k - 1
)
def test_causal_conv_body_agrees_with_kernel_numpy_and_reference_evaluator(
    activation, length, kernel
):
    model = _conv_call(length, kernel, activation)
    overload = "" if activation == "none" else activation
    assert register_functions(model) == [(MS_DOMAIN, "CausalConvWithState", overload)]
    feeds = random_feeds(model)
    expected = _conv_numpy(feeds, activation)
    kernel_out = run(model, feeds)  # onnxruntime's kernel (it prefers it to the body)
    expanded = clone(model)
    InlinePass()(expanded)
    assert all(node.domain == "" for node in expanded.graph)
    proto = ir.to_proto(expanded)
    onnx.checker.check_model(proto, full_check=True)
    body_out = run(expanded, feeds)
    reference_out = ReferenceEvaluator(ir.to_proto(model)).run(None, feeds)
    for got in (kernel_out, body_out, reference_out):
        for value, want in zip(got, expected, strict=True):
            np.testing.assert_allclose(value, want, atol=TOLERANCE, rtol=0)


def test_causal_conv_with_a_bias_gets_no_body():
    model = parse(
        """agraph (float[2,6,5] x, float[6,1,3] w, float[6] b, float[2,6,2] past)
                => (float[2,6,5] y, float[2,6,2] present) {
            y, present = com.microsoft.CausalConvWithState(x, w, b, past)
        }""",
        header=HEADER,
    )
    assert register_functions(model) == []


def test_capability_field_decides_where_the_conv_body_is_inlined():
    """cpu keeps the fused op; onnx-standard, and an EP whose capabilities say it has no
    kernel, get the body (only standard ops remain)."""
    import dataclasses

    from mobius_genai.ep import get_ep
    from mobius_genai.optimize import optimize_model

    no_kernel = dataclasses.replace(
        get_ep("default"), name="no-conv", supports_causal_conv_with_state=False
    )
    for caps, fused in (
        (get_ep("cpu"), True),
        (get_ep("onnx-standard"), False),
        (no_kernel, False),
    ):
        model = _conv_call(5, 3, "none")
        register_functions(model)
        optimize_model(model, caps)
        ops = {(node.domain, node.op_type) for node in model.graph}
        assert ((MS_DOMAIN, "CausalConvWithState") in ops) == fused, caps.name
        if not fused:
            assert {domain for domain, _ in ops} == {""}
