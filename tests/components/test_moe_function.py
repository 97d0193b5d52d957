"""com.microsoft::MoE: onnxruntime 1.32's CPU kernel and the standard-ONNX body both compute the
routing this package emits (softmax over the experts, top-k, optional renormalization, SwiGLU
experts with interleaved gate/up rows), checked against numpy."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx_ir.passes.common import InlinePass

from mobius_genai.components.tier1 import MS_DOMAIN, register_functions

TOKENS, HIDDEN, INTER, EXPERTS = 9, 8, 6, 5
TOLERANCE = 1e-5


def _softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference(feeds, k, normalize, alpha=1.0, beta=0.0, limit=math.inf) -> np.ndarray:
    """The routing of transformers' TopKRouter and the experts of its SwiGLU MLPs, in numpy."""
    x = feeds["x"].reshape(-1, HIDDEN).astype(np.float64)
    probs = _softmax(feeds["router"].astype(np.float64))
    out = np.zeros_like(x)
    for t in range(len(x)):
        picked = np.argsort(-probs[t])[:k]
        weights = probs[t, picked] / (probs[t, picked].sum() if normalize else 1.0)
        for e, weight in zip(picked, weights, strict=True):
            fused = feeds["fc1"][e] @ x[t] + feeds.get("b1", np.zeros((EXPERTS, 2 * INTER)))[e]
            gate = np.minimum(fused[0::2], limit)
            up = np.clip(fused[1::2], -limit, limit)
            act = gate / (1 + np.exp(-alpha * gate)) * (up + beta)
            expert = feeds["fc2"][e] @ act + feeds.get("b2", np.zeros((EXPERTS, HIDDEN)))[e]
            out[t] += weight * expert
    return out.reshape(feeds["x"].shape)


def _model(biased: bool, **attributes) -> ir.Model:
    f32 = ir.DataType.FLOAT
    x = ir.Value(name="x", type=ir.TensorType(f32), shape=ir.Shape([1, TOKENS, HIDDEN]))
    router = ir.Value(name="router", type=ir.TensorType(f32), shape=ir.Shape([TOKENS, EXPERTS]))
    fc1 = ir.Value(
        name="fc1", type=ir.TensorType(f32), shape=ir.Shape([EXPERTS, 2 * INTER, HIDDEN])
    )
    fc2 = ir.Value(name="fc2", type=ir.TensorType(f32), shape=ir.Shape([EXPERTS, HIDDEN, INTER]))
    inputs = [x, router, fc1, fc2]
    if biased:
        b1 = ir.Value(name="b1", type=ir.TensorType(f32), shape=ir.Shape([EXPERTS, 2 * INTER]))
        b2 = ir.Value(name="b2", type=ir.TensorType(f32), shape=ir.Shape([EXPERTS, HIDDEN]))
        inputs += [b1, b2]
        args = [x, router, fc1, b1, fc2, b2]
    else:
        args = [x, router, fc1, None, fc2]
    attrs = {"activation_type": "swiglu", "swiglu_fusion": 1, **attributes}
    node = ir.node(
        "MoE", args, attrs, domain=MS_DOMAIN, overload="bias" if biased else "", name="moe"
    )
    node.outputs[0].name = "y"
    node.outputs[0].type = ir.TensorType(f32)
    node.outputs[0].shape = ir.Shape([1, TOKENS, HIDDEN])
    graph = ir.Graph(
        inputs, node.outputs, nodes=[node], opset_imports={"": 24, MS_DOMAIN: 1}, name="moe"
    )
    model = ir.Model(graph, ir_version=10)
    register_functions(model)
    return model


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})[0]


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((1, TOKENS, HIDDEN)).astype(np.float32),
        "router": rng.standard_normal((TOKENS, EXPERTS)).astype(np.float32),
        "fc1": (0.4 * rng.standard_normal((EXPERTS, 2 * INTER, HIDDEN))).astype(np.float32),
        "fc2": (0.4 * rng.standard_normal((EXPERTS, HIDDEN, INTER))).astype(np.float32),
        "b1": (0.3 * rng.standard_normal((EXPERTS, 2 * INTER))).astype(np.float32),
        "b2": (0.3 * rng.standard_normal((EXPERTS, HIDDEN))).astype(np.float32),
    }


CASES = {
    "top1": dict(k=1, normalize_routing_weights=0),
    "top2_renormalized": dict(k=2, normalize_routing_weights=1),
    "top3_not_renormalized": dict(k=3, normalize_routing_weights=0),
    "top2_clamped_swiglu": dict(
        k=2,
        normalize_routing_weights=1,
        activation_alpha=1.702,
        activation_beta=1.0,
        swiglu_limit=0.7,
    ),
}


@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_and_body_compute_the_routing(case, biased):
    attributes = CASES[case]
    model = _model(biased, **attributes)
    feeds = _feeds()
    if not biased:
        feeds = {k: v for k, v in feeds.items() if k not in ("b1", "b2")}
    expected = _reference(
        feeds,
        attributes["k"],
        attributes["normalize_routing_weights"],
        attributes.get("activation_alpha", 1.0),
        attributes.get("activation_beta", 0.0),
        attributes.get("swiglu_limit", math.inf),
    )
    kernel = _run(model, feeds)
    np.testing.assert_allclose(kernel, expected, atol=TOLERANCE)
    InlinePass()(model)
    assert all(node.domain == "" for node in model.graph)
    onnx.checker.check_model(ir.to_proto(model), full_check=True)
    np.testing.assert_allclose(_run(model, feeds), expected, atol=TOLERANCE)


def test_kernel_ignores_use_sparse_mixer():
    """Why phimoe's sparsemixer cannot be this op on the CPU EP: the attribute changes nothing."""
    feeds = {k: v for k, v in _feeds(1).items() if k not in ("b1", "b2")}
    plain = _run(_model(False, k=2), feeds)
    mixer = _run(_model(False, k=2, use_sparse_mixer=1), feeds)
    np.testing.assert_array_equal(plain, mixer)
