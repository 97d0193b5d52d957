"""com.microsoft::MoE: onnxruntime 1.32's CPU kernel and the standard-ONNX body both compute the
routing this package emits (softmax over the experts, top-k, optional renormalization, SwiGLU
experts with interleaved gate/up rows), checked against numpy; so does the body's GeGLU overload
(Gemma 4's experts), which no onnxruntime 1.32 CPU kernel takes. The body reads only the experts
some token picked."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import InlinePass

from mobius_genai.components.tier1 import MS_DOMAIN, register_functions

TOKENS, HIDDEN, INTER, EXPERTS = 9, 8, 6, 8
TOLERANCE = 1e-5


def _softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _gelu_tanh(a: np.ndarray) -> np.ndarray:
    return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))


def _reference(feeds, k, normalize, alpha=1.0, beta=0.0, limit=math.inf, geglu=False) -> np.ndarray:
    """The routing of transformers' TopKRouter and the experts of its SwiGLU (or GeGLU) MLPs,
    in numpy."""
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
            if geglu:
                act = _gelu_tanh(fused[0::2]) * fused[1::2]
            expert = feeds["fc2"][e] @ act + feeds.get("b2", np.zeros((EXPERTS, HIDDEN)))[e]
            out[t] += weight * expert
    return out.reshape(feeds["x"].shape)


def _model(biased: bool, overload: str | None = None, **attributes) -> ir.Model:
    f32 = ir.DataType.FLOAT
    x = ir.Value(name="x", type=ir.TensorType(f32), shape=ir.Shape([1, "tokens", HIDDEN]))
    router = ir.Value(name="router", type=ir.TensorType(f32), shape=ir.Shape(["tokens", EXPERTS]))
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
    if overload is None:
        overload = "bias" if biased else ""
    node = ir.node("MoE", args, attrs, domain=MS_DOMAIN, overload=overload, name="moe")
    node.outputs[0].name = "y"
    node.outputs[0].type = ir.TensorType(f32)
    node.outputs[0].shape = ir.Shape([1, "tokens", HIDDEN])
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
@pytest.mark.parametrize("tokens", [TOKENS, 1])
def test_kernel_and_body_compute_the_routing(case, biased, tokens):
    """With all tokens most experts are picked (the body runs them all); one token picks under
    a third of them (the body gathers those)."""
    attributes = CASES[case]
    model = _model(biased, **attributes)
    feeds = _feeds()
    feeds["x"], feeds["router"] = feeds["x"][:, :tokens], feeds["router"][:tokens]
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
    np.testing.assert_allclose(_run(_inlined(model), feeds), expected, atol=TOLERANCE)


def test_kernel_ignores_use_sparse_mixer():
    """Why phimoe's sparsemixer cannot be this op on the CPU EP: the attribute changes nothing."""
    feeds = {k: v for k, v in _feeds(1).items() if k not in ("b1", "b2")}
    plain = _run(_model(False, k=2), feeds)
    mixer = _run(_model(False, k=2, use_sparse_mixer=1), feeds)
    np.testing.assert_array_equal(plain, mixer)


def _inlined(model: ir.Model) -> ir.Model:
    InlinePass()(model)
    assert all(node.domain == "" for node in model.graph)
    onnx.checker.check_model(ir.to_proto(model), full_check=True)
    return model


def _geglu_model(**attributes) -> ir.Model:
    return _model(
        False, "geglu", activation_type="geglu", normalize_routing_weights=1, **attributes
    )


@pytest.mark.parametrize("k", [1, 2, 3])
def test_geglu_body_computes_gemma4_experts(k):
    feeds = {name: v for name, v in _feeds(2).items() if name not in ("b1", "b2")}
    expected = _reference(feeds, k, normalize=True, geglu=True)
    np.testing.assert_allclose(_run(_inlined(_geglu_model(k=k)), feeds), expected, atol=TOLERANCE)


def _unpicked_poisoned(feeds: dict[str, np.ndarray], k: int, tokens: int) -> dict[str, np.ndarray]:
    """The first `tokens` tokens only, and NaN in every weight of the experts none of them
    picks: a body that reads those experts (even weighting them by zero) returns NaN."""
    feeds = dict(feeds)
    feeds["x"] = feeds["x"][:, :tokens]
    feeds["router"] = feeds["router"][:tokens]
    picked = np.unique(np.argsort(-feeds["router"], axis=-1)[:, :k])
    unpicked = np.setdiff1d(np.arange(EXPERTS), picked)
    assert unpicked.size, "the case must leave some expert unpicked"
    for name in ("fc1", "fc2", "b1", "b2"):
        if name in feeds:
            feeds[name] = feeds[name].copy()
            feeds[name][unpicked] = np.nan
    return feeds


@pytest.mark.parametrize(("tokens", "k"), [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("overload", ["", "bias", "geglu"])
def test_body_reads_only_the_picked_experts(overload, tokens, k):
    """A decode step (one token, or a few) computes its k experts, not all of them (while the
    picked experts are under a third of all, as here)."""
    clean = _feeds(3)
    if overload != "bias":
        clean = {name: v for name, v in clean.items() if name not in ("b1", "b2")}
    if overload == "geglu":
        model = _geglu_model(k=k)
    else:
        model = _model(overload == "bias", k=k, normalize_routing_weights=1)
    feeds = _unpicked_poisoned(clean, k, tokens)
    expected = _reference(
        {**clean, "x": feeds["x"], "router": feeds["router"]},
        k,
        normalize=True,
        geglu=overload == "geglu",
    )
    got = _run(_inlined(model), feeds)
    np.testing.assert_allclose(got, expected, atol=TOLERANCE)


def _gather_experts_model(op_type: str, data: np.ndarray, scales: np.ndarray, block: int):
    """`op_type` of the experts [E, N, K] picked by `index`: int4 codes (ONNX Gather) or packed
    uint8 codes (com.microsoft::GatherBlockQuantized, blocks along K, zero point 8)."""
    index = helper.make_tensor_value_info("index", TensorProto.INT64, [None])
    if op_type == "Gather":
        codes = helper.make_tensor("codes", TensorProto.INT4, data.shape, data.flatten().tolist())
        node = helper.make_node("Gather", ["codes", "index"], ["y"])
        out = helper.make_tensor_value_info("y", TensorProto.INT4, None)
    else:
        unsigned = (data + 8).astype(np.uint8)
        codes = numpy_helper.from_array(unsigned[..., 0::2] | (unsigned[..., 1::2] << 4), "codes")
        node = helper.make_node(
            "GatherBlockQuantized",
            ["codes", "index", "scales"],
            ["y"],
            domain=MS_DOMAIN,
            gather_axis=0,
            quantize_axis=2,
            block_size=block,
        )
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(
        [node], "g", [index], [out], initializer=[codes, numpy_helper.from_array(scales, "scales")]
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def test_onnxruntime_cpu_gathers_int4_experts_only_block_quantized():
    """Where int4 experts for this body would come from (not done yet): onnxruntime 1.32 CPU's
    GatherBlockQuantized takes 3-D [E, N, K] experts with blocks along K and dequantizes the
    picked ones exactly, while ONNX's Gather takes no int4 tensor (so Gather + DequantizeLinear
    cannot read only the picked experts). Should either change, this fails."""
    experts, rows, cols, block = 6, 4, 64, 32
    rng = np.random.default_rng(4)
    data = rng.integers(-8, 8, (experts, rows, cols)).astype(np.int8)
    scales = (rng.random((experts, rows, cols // block)) + 0.5).astype(np.float32)
    index = np.array([4, 1], np.int64)
    expected = (data * np.repeat(scales, block, axis=2))[index]
    with pytest.raises(Exception, match=r"tensor\(int4\).*Gather"):
        ort.InferenceSession(_gather_experts_model("Gather", data, scales, block))
    session = ort.InferenceSession(
        _gather_experts_model("GatherBlockQuantized", data, scales, block),
        providers=["CPUExecutionProvider"],
    )
    np.testing.assert_array_equal(session.run(None, {"index": index})[0], expected)
