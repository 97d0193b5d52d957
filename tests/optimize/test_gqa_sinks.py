"""GQASinkFusion: onnxruntime's GroupQueryAttention ``head_sink`` computes attention with sinks,
and gpt_oss's attention becomes it where the capabilities say so (and stays standard elsewhere,
with the reason in the report).
"""

from __future__ import annotations

import collections
import dataclasses
import warnings

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mobius_genai
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.ep.registry import get_ep
from mobius_genai.optimize.rules import gqa
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference

HEAD_SINK = 11  # GroupQueryAttention's input position
LAYERS = 3


def _sink_softmax_reference(q, k, v, sinks, scale, heads, kv_heads, head_dim, past):
    """Causal attention whose softmax rows get a sink column, dropped after the softmax."""
    batch, seq, _ = q.shape
    query = q.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)
    keys = np.repeat(k.reshape(batch, -1, kv_heads, head_dim).transpose(0, 2, 1, 3), 2, 1)
    values = np.repeat(v.reshape(batch, -1, kv_heads, head_dim).transpose(0, 2, 1, 3), 2, 1)
    scores = query @ keys.transpose(0, 1, 3, 2) * scale
    scores = scores + np.triu(np.full((seq, past + seq), -np.inf), k=past + 1)
    sink = np.broadcast_to(sinks.reshape(1, heads, 1, 1), (batch, heads, seq, 1))
    joined = np.concatenate([scores, sink], -1)
    probs = np.exp(joined - joined.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return (probs[..., :-1] @ values).transpose(0, 2, 1, 3).reshape(batch, seq, -1)


def test_cpu_gqa_head_sink_is_a_softmax_column_dropped_after_it():
    batch, seq, heads, kv_heads, head_dim = 1, 5, 4, 2, 8
    sinks = np.array([0.5, -1.0, 2.0, 0.1], np.float32)
    inputs = ["q", "k", "v", "", "", "seqlens_k", "total", "", "", "", "", "sinks"]
    node = helper.make_node(
        "GroupQueryAttention", inputs, ["y", "pk", "pv"], domain=MS_DOMAIN,
        num_heads=heads, kv_num_heads=kv_heads, scale=0.3,
    )  # fmt: skip
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node],
        "gqa",
        [info(name, TensorProto.FLOAT, None) for name in "qkv"]
        + [info("seqlens_k", TensorProto.INT32, None), info("total", TensorProto.INT32, None)],
        [info(name, TensorProto.FLOAT, None) for name in ("y", "pk", "pv")],
        initializer=[numpy_helper.from_array(sinks, "sinks")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid(MS_DOMAIN, 1)]
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, seq, heads * head_dim), dtype=np.float32)
    k, v = (rng.standard_normal((batch, seq, kv_heads * head_dim), dtype=np.float32) for _ in "kv")
    lengths = {"seqlens_k": np.array([seq - 1], np.int32), "total": np.array(seq, np.int32)}
    (ours, *_) = session.run(None, {"q": q, "k": k, "v": v, **lengths})
    reference = _sink_softmax_reference(q, k, v, sinks, 0.3, heads, kv_heads, head_dim, past=0)
    assert np.abs(ours - reference).max() <= 1e-5
    plain = _sink_softmax_reference(q, k, v, np.full(heads, -np.inf), 0.3, heads, 2, 8, past=0)
    assert np.abs(plain - reference).max() > 1e-2  # the sinks matter


def _graph(tmp_path, ep):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss")
    package = mobius_genai.build(ckpt, ep, load_weights=False, trace_optimization=True)
    return package, collections.Counter(node.op_type for node in package["model"].graph)


@pytest.mark.parametrize("ep", ["cpu", "cuda"])
def test_sink_attention_becomes_gqa_with_head_sink(ep, tmp_path):
    package, counts = _graph(tmp_path, ep)
    assert counts["GroupQueryAttention"] == LAYERS and counts["Attention"] == 0
    windows = []
    for node in package["model"].graph:
        if node.op_type == "GroupQueryAttention":
            assert node.inputs[HEAD_SINK].name.endswith("self_attn.sinks")
            assert node.inputs[gqa.COS_CACHE] is not None
            windows.append(node.attributes.get_int("local_window_size", -1))
    assert windows == [5, -1, 5]  # sliding, full, sliding
    assert counts["ReduceMax"] == counts["Log"] == 0  # the rescaling went with it


@pytest.mark.parametrize("ep", ["webgpu", "dml"])
def test_without_head_sink_the_standard_sink_attention_stays(ep, tmp_path):
    assert not get_ep(ep).supports_gqa_head_sink
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "GQA expected" warning: staying is the plan
        package, counts = _graph(tmp_path, ep)
    assert counts["Attention"] == LAYERS and counts["GroupQueryAttention"] == 0
    (report,) = package.reports.values()
    assert report.skipped["GQASinkFusion"] == "supports_gqa_head_sink=False"


def test_fused_f16_sinks_match_the_standard_f16_graph(tmp_path):
    """The widened form (f16 model, sinks cast to float32) fuses too, and GQA's f16 kernel
    gives what the standard f16 graph gives (an out-of-tree EP: cpu with GQA in f16)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt_oss", seed=1)
    reference = hf_reference_logits(ckpt, np.random.default_rng(0).integers(3, 128, (1, 12)), 2)
    cpu = get_ep("cpu")
    f16_gqa = dataclasses.replace(cpu, name="cpu-f16-gqa", gqa_dtypes={ir.DataType.FLOAT16})
    logits = {}
    for name, ep in (("standard", "default"), ("fused", f16_gqa)):
        package = mobius_genai.build(ckpt, ep, "f16", progress=False)
        counts = collections.Counter(node.op_type for node in package["model"].graph)
        assert counts["GroupQueryAttention"] == (LAYERS if name == "fused" else 0)
        logits[name] = run_like_reference(ort_session(package, tmp_path / name), reference)
    assert max_abs_diff(logits["fused"], logits["standard"]) <= 2e-2
    assert max_abs_diff(logits["fused"], reference.logits) <= 5e-2
