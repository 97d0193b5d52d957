"""com.microsoft::PackedMultiHeadAttention's standard body (components/attention_bodies.py):
each packed sequence attends within itself, checked against numpy; and the pipeline keeps the
op only for a vision tower on an EP with the kernel, inlining it for every other role."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx_ir.passes.common import InlinePass

from mobius_genai.components import attention_bodies
from mobius_genai.components.tier1 import MS_DOMAIN, register_functions
from mobius_genai.optimize import optimize_model

HEADS, HEAD_SIZE, V_HEAD_SIZE = 2, 4, 3
LENGTHS = (3, 1, 5, 2)
TOLERANCE = 1e-6


def _token_offset(lengths) -> np.ndarray:
    """onnxruntime's GetPaddingOffset: real tokens' padded positions, then the padding's."""
    longest = max(lengths)
    real = [b * longest + s for b, n in enumerate(lengths) for s in range(n)]
    padding = [b * longest + s for b, n in enumerate(lengths) for s in range(n, longest)]
    return np.array(real + padding, np.int32).reshape(len(lengths), longest)


def _reference(q, k, v, lengths, scale) -> np.ndarray:
    out = np.zeros((len(q), HEADS * V_HEAD_SIZE))
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        for h in range(HEADS):
            qh = q[rows, h * HEAD_SIZE : (h + 1) * HEAD_SIZE].astype(np.float64)
            kh = k[rows, h * HEAD_SIZE : (h + 1) * HEAD_SIZE].astype(np.float64)
            vh = v[rows, h * V_HEAD_SIZE : (h + 1) * V_HEAD_SIZE].astype(np.float64)
            scores = qh @ kh.T * scale
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            weights /= weights.sum(-1, keepdims=True)
            out[rows, h * V_HEAD_SIZE : (h + 1) * V_HEAD_SIZE] = weights @ vh
        start += n
    return out


def _model(**attributes) -> ir.Model:
    f32, i32 = ir.DataType.FLOAT, ir.DataType.INT32
    tokens = sum(LENGTHS)

    def value(name, dtype, shape):
        return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))

    q = value("q", f32, [tokens, HEADS * HEAD_SIZE])
    k = value("k", f32, [tokens, HEADS * HEAD_SIZE])
    v = value("v", f32, [tokens, HEADS * V_HEAD_SIZE])
    offset = value("token_offset", i32, [len(LENGTHS), max(LENGTHS)])
    cumulative = value("cumulative", i32, [len(LENGTHS) + 1])
    node = ir.node(
        "PackedMultiHeadAttention",
        [q, k, v, None, offset, cumulative],
        attributes={"num_heads": HEADS, **attributes},
        domain=MS_DOMAIN,
    )
    node.outputs[0].name = "out"
    node.outputs[0].type = ir.TensorType(f32)
    graph = ir.Graph(
        [q, k, v, offset, cumulative],
        node.outputs,
        nodes=[node],
        opset_imports={"": 24, MS_DOMAIN: 1},
    )
    model = ir.Model(graph, ir_version=10)
    register_functions(model)
    return model


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = sum(LENGTHS)
    return {
        "q": rng.standard_normal((tokens, HEADS * HEAD_SIZE), np.float32),
        "k": rng.standard_normal((tokens, HEADS * HEAD_SIZE), np.float32),
        "v": rng.standard_normal((tokens, HEADS * V_HEAD_SIZE), np.float32),
        "token_offset": _token_offset(LENGTHS),
        "cumulative": np.cumsum((0, *LENGTHS)).astype(np.int32),
    }


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    proto = ir.serde.serialize_model(model).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("chunk", [1024, 2, 3])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_the_body_attends_within_each_sequence(scale, chunk, monkeypatch):
    """Also with the queries taken 2 or 3 at a time (5 padded to 3 x 2 and 2 x 3 rows)."""
    monkeypatch.setattr(attention_bodies, "_QUERY_CHUNK", chunk)
    attributes = {} if scale is None else {"scale": scale}
    model = _model(**attributes)
    InlinePass()(model)
    assert all(node.domain != MS_DOMAIN for node in model.graph)
    feeds = _feeds()
    expected = _reference(
        feeds["q"], feeds["k"], feeds["v"], LENGTHS, HEAD_SIZE**-0.5 if scale is None else scale
    )
    np.testing.assert_allclose(_run(model, feeds), expected, atol=TOLERANCE, rtol=0)


def test_the_body_reads_the_cumulative_lengths():
    """Sequences of 3 + 1 tokens told as 4 + 0: the first four tokens then see each other."""
    model = _model()
    InlinePass()(model)
    feeds = _feeds()
    feeds["cumulative"][1:3] = (4, 4)
    expected = _reference(feeds["q"], feeds["k"], feeds["v"], LENGTHS, HEAD_SIZE**-0.5)
    assert np.abs(_run(model, feeds) - expected)[:4].max() > 100 * TOLERANCE


@pytest.mark.parametrize(("role", "kept"), [("vision", 1), ("decoder", 0), ("encoder", 0)])
def test_only_a_vision_tower_keeps_the_op_where_the_ep_has_the_kernel(role, kept):
    model = _model()
    report = optimize_model(model, "cuda", ir.DataType.FLOAT, role)
    packed = [node for node in model.graph if node.op_type == "PackedMultiHeadAttention"]
    assert len(packed) == kept
    assert report.rules["InlinePass"].removed["PackedMultiHeadAttention"] == 1 - kept
    if not kept:
        assert report.skipped["PackedMHA"].startswith(f"role {role!r}")
        np.testing.assert_allclose(
            _run(model, _feeds()),
            _reference(*(_feeds()[name] for name in "qkv"), LENGTHS, HEAD_SIZE**-0.5),
            atol=TOLERANCE,
            rtol=0,
        )
