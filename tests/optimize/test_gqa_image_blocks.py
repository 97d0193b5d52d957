"""GQAImageBlockFusion: onnxruntime's GroupQueryAttention with ``causal=0`` and an
``attention_bias`` computes attention under that bias alone (image tokens seeing later image
tokens), and Gemma 3's decoder gets it where the EP's kernel takes the bias."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.ep.registry import get_ep
from mobius_genai.optimize.gates import FUSIONS, GateInput, RuleGroup

HEADS, KV_HEADS, HEAD_DIM, LENGTH = 4, 2, 16, 64
LOWEST = np.finfo(np.float32).min


def _session(causal: int) -> ort.InferenceSession:
    names = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total", "cos", "sin", "", "bias"]
    node = helper.make_node(
        "GroupQueryAttention", names, ["y", "present_k", "present_v"], domain=MS_DOMAIN,
        num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1, causal=causal,
    )  # fmt: skip
    info = helper.make_tensor_value_info
    types = {"seqlens_k": TensorProto.INT32, "total": TensorProto.INT32}
    graph = helper.make_graph(
        [node],
        "gqa",
        [info(name, types.get(name, TensorProto.FLOAT), None) for name in names if name],
        [info(name, TensorProto.FLOAT, None) for name in ("y", "present_k", "present_v")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid(MS_DOMAIN, 1)]
    )
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _tables() -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / 10_000 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    angles = np.arange(LENGTH)[:, None] * inv[None]
    return np.cos(angles), np.sin(angles)


def _rotate(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x [seq, heads, dim] rotated in halves at `positions` (float64)."""
    cos, sin = (table[positions][:, None] for table in _tables())
    first, second = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)


def _reference(q, keys, values, allowed, positions) -> np.ndarray:
    """Softmax attention of rotated q over all `keys` where `allowed` [seq, total] (float64)."""
    seq = q.shape[1]
    query = _rotate(q[0].reshape(seq, HEADS, HEAD_DIM).astype(np.float64), positions)
    keys = np.repeat(keys, HEADS // KV_HEADS, 1)
    values = np.repeat(values, HEADS // KV_HEADS, 1)
    scores = np.einsum("snd,tnd->nst", query, keys) / np.sqrt(HEAD_DIM)
    scores = np.where(allowed[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("nst,tnd->snd", probs, values).reshape(seq, -1)


def _bias(allowed: np.ndarray) -> np.ndarray:
    return np.where(allowed, 0, LOWEST).astype(np.float32)[None, None]


@pytest.mark.parametrize("window", [None, 3])
def test_cpu_gqa_without_causal_follows_the_bias_alone(window):
    """Prefill of text, an image of 3 tokens, text, an image of 2 (each image's tokens see each
    other both ways; a window cuts what is further back), then a decode step over the cache."""
    rng = np.random.default_rng(0)
    runs = np.array([-1, -1, 0, 0, 0, -1, 1, 1])
    seq = len(runs)
    q = rng.standard_normal((1, seq, HEADS * HEAD_DIM), dtype=np.float32)
    k, v = (rng.standard_normal((1, seq, KV_HEADS * HEAD_DIM), dtype=np.float32) for _ in "kv")
    query, key = np.arange(seq)[:, None], np.arange(seq)[None]
    allowed = (key <= query) | ((runs[:, None] == runs[None]) & (runs[:, None] >= 0))
    if window:
        allowed &= key > query - window
    cos, sin = (table.astype(np.float32) for table in _tables())
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    session, causal = _session(causal=0), _session(causal=1)
    feeds = {
        "q": q, "k": k, "v": v, "past_k": empty, "past_v": empty, "cos": cos, "sin": sin,
        "seqlens_k": np.array([seq - 1], np.int32), "total": np.array(seq, np.int32),
        "bias": _bias(allowed),
    }  # fmt: skip
    ours, past_k, past_v = session.run(None, feeds)
    keys = _rotate(k[0].reshape(seq, KV_HEADS, HEAD_DIM).astype(np.float64), np.arange(seq))
    values = v[0].reshape(seq, KV_HEADS, HEAD_DIM).astype(np.float64)
    reference = _reference(q, keys, values, allowed, np.arange(seq))
    assert np.abs(ours[0] - reference).max() <= 1e-5
    assert np.abs(causal.run(None, feeds)[0][0] - reference).max() > 1e-2  # causal=1 cannot

    step = {name: rng.standard_normal((1, 1, width), dtype=np.float32) for name, width in
            (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM))}  # fmt: skip
    reach = np.arange(seq + 1)[None] > (seq - window if window else -1)
    feeds.update(
        step, past_k=past_k, past_v=past_v, bias=_bias(reach),
        seqlens_k=np.array([seq], np.int32), total=np.array(seq + 1, np.int32),
    )  # fmt: skip
    (ours, *_) = session.run(None, feeds)
    new_key = _rotate(step["k"][0].reshape(1, KV_HEADS, HEAD_DIM).astype(np.float64), [seq])
    keys = np.concatenate([past_k[0].transpose(1, 0, 2), new_key])
    values = np.concatenate([past_v[0].transpose(1, 0, 2), step["v"][0].reshape(1, KV_HEADS, -1)])
    reference = _reference(step["q"], keys, values, reach, np.array([seq]))
    assert np.abs(ours[0] - reference).max() <= 1e-5


def _group(name: str) -> RuleGroup:
    return next(group for group in FUSIONS if group.name == name)


@pytest.mark.parametrize(
    ("ep", "reason"),
    [
        ("cpu", None),
        ("dml", "no GroupQueryAttention.attention_bias kernel"),
        ("onnx-standard", "gqa_dtypes"),
    ],
)
def test_the_gate_reads_the_kernel_table(ep, reason):
    caps = get_ep(ep)
    gate = _group("GQAImageBlockFusion").gate
    said = gate(GateInput(caps, caps.default_dtype, "decoder"))
    assert said is None if reason is None else reason in said


def test_an_ep_that_cannot_rotate_in_gqa_keeps_the_image_bias_out_of_it():
    """SeparateRoPE would have to take the rotation out of GQA, and it keeps no bias."""
    caps = get_ep("cpu").with_kernels({"GroupQueryAttention.do_rotary": False})
    said = _group("GQAImageBlockFusion").gate(GateInput(caps, caps.default_dtype, "decoder"))
    assert said is not None and "supports_fused_rope" in said


def test_graph_capture_keeps_the_image_bias_out_of_gqa():
    """og's static attention_mask (graph capture) is as wide as max_length, not the total."""
    caps = get_ep("cuda").with_graph_capture(True)
    said = _group("GQAImageBlockFusion").gate(GateInput(caps, caps.default_dtype, "decoder"))
    assert said is not None and "graph_capture" in said
    plain = get_ep("cuda")
    assert (
        _group("GQAImageBlockFusion").gate(GateInput(plain, plain.default_dtype, "decoder")) is None
    )
