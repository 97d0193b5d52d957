"""Qwen3.5 (qwen3_5_text: gated delta nets between gated attention layers) beyond the family
parity table: a prefill longer than transformers' 64-token chunks then decode steps carrying
both states, on the portable, cpu and strict-ONNX graphs; a graph with a wrong gate fails it;
the portable graph on onnx's reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

import mobius_genai
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4  # f32
PREFILL = 70  # transformers runs the prefill in 64-token chunks, then one token at a time


@pytest.fixture(scope="module")
def qwen3_5(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "ckpt", "qwen3_5_text")


@pytest.fixture(scope="module")
def long_run(qwen3_5):
    """transformers' chunked prefill of 70 tokens, then 4 per-token decode steps."""
    ids = np.random.default_rng(0).integers(3, 128, size=(1, PREFILL))
    return hf_reference_logits(qwen3_5, ids, decode_steps=4)


@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # fused ops with their bodies
        ("cpu", {"", "com.microsoft"}),
        ("onnx-standard", {""}),  # the bodies inlined: a Scan carries the state
    ],
)
def test_long_prefill_then_decode_matches_transformers(qwen3_5, long_run, ep, domains, tmp_path):
    package = mobius_genai.build(qwen3_5, ep, "f32")
    model = package["model"]
    assert {node.domain for node in model.graph.all_nodes()} == domains
    ours = run_like_reference(ort_session(package, tmp_path), long_run)
    assert max_abs_diff(ours, long_run.logits) <= TOLERANCE


def _drop_gate(model: ir.Model, input_index: int, kept: int) -> None:
    """Feed each LinearAttention's input `input_index` from input `kept` of its producer."""
    calls = [node for node in model.graph.all_nodes() if node.op_type == "LinearAttention"]
    assert len(calls) == 2
    for node in calls:
        node.replace_input_with(input_index, node.inputs[input_index].producer().inputs[kept])


@pytest.mark.parametrize(
    ("input_index", "kept", "source"),
    [
        (5, 0, "MatMul"),  # beta = b instead of sigmoid(b)
        (4, 1, "Softplus"),  # g = softplus(a + dt_bias): the factor -exp(A_log) lost, g > 0
    ],
)
def test_a_graph_with_a_wrong_gate_fails_parity(
    qwen3_5, long_run, input_index, kept, source, tmp_path
):
    package = mobius_genai.build(qwen3_5, "cpu", "f32")
    _drop_gate(package["model"], input_index, kept)
    for node in package["model"].graph.all_nodes():
        if node.op_type == "LinearAttention":
            assert node.inputs[input_index].producer().op_type == source
    ours = run_like_reference(ort_session(package, tmp_path), long_run)
    assert not max_abs_diff(ours, long_run.logits) <= 10 * TOLERANCE  # NaN fails it too


def test_portable_graph_runs_on_the_reference_evaluator(qwen3_5):
    """A runtime without the kernels (onnx's reference evaluator) runs the Tier-1 bodies of
    CausalConvWithState and LinearAttention and gets transformers' logits."""
    ids = np.random.default_rng(2).integers(3, 128, size=(1, 9))
    reference = hf_reference_logits(qwen3_5, ids, decode_steps=0)
    model = mobius_genai.build(qwen3_5, "default", "f32")["model"]
    evaluator = ReferenceEvaluator(ir.to_proto(model))
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.arange(9)[None],
    }
    for value in model.graph.inputs:
        if value.name not in feeds:  # empty KV caches [1, heads, 0, dim], zero states
            sizes = [1, *value.shape[1:]]
            if value.name.endswith((".key", ".value")):
                sizes[2] = 0
            feeds[value.name] = np.zeros(sizes, np.float32)
    (logits,) = evaluator.run(["logits"], feeds)
    assert max_abs_diff([logits], reference.logits) <= TOLERANCE
