"""PhiMoE: sparsemixer routing vs transformers, the fused form that keeps it exact, bad input.

f32, 2 x 12-token prefill + 4 cached decode steps, <= 1e-4 on the portable graph, the cpu graph
(two com.microsoft::MoE nodes per layer, k=1 each) and onnx-standard (their bodies inlined).
The plain phimoe case runs in test_moe.py with the other MoE families; this file adds what only
phimoe has.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from transformers.models.phimoe.modeling_phimoe import sparsemixer

import mobius_genai
from mobius_genai.components import sparsemixer as components_sparsemixer
from mobius_genai.config.moe import SparseMixer
from mobius_genai.errors import ConfigError
from mobius_genai.models import FAMILIES
from tests._hf import edit_config, hf_reference_logits, load_reference_model, write_tiny_checkpoint
from tests._ort import case_diffs, max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4
SEED = 3  # tokens of the prompts pick 4, 3 and 2 different pairs in the three layers
EPS = ("default", "cpu", "onnx-standard")
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
    "long_factor": [1.0, 1.5, 2.2, 3.0, 4.1, 5.5, 7.2, 9.0],
    "short_mscale": 1.2,
    "long_mscale": 1.4,
    "original_max_position_embeddings": 16,
    "rope_theta": 10000.0,
}


def _ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 128, size=(2, 12))


def _moe_node_model(use_sparse_mixer: int, tokens: int, experts: int, hidden: int, inter: int):
    """One com.microsoft::MoE node (k=2, SwiGLU interleaved) as an onnx model."""
    from onnx import TensorProto, helper

    node = helper.make_node(
        "MoE",
        ["x", "router", "fc1", "", "fc2"],
        ["y"],
        domain="com.microsoft",
        k=2,
        activation_type="swiglu",
        swiglu_fusion=1,
        use_sparse_mixer=use_sparse_mixer,
    )
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, hidden]),
        helper.make_tensor_value_info("router", TensorProto.FLOAT, [tokens, experts]),
        helper.make_tensor_value_info("fc1", TensorProto.FLOAT, [experts, 2 * inter, hidden]),
        helper.make_tensor_value_info("fc2", TensorProto.FLOAT, [experts, hidden, inter]),
    ]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [tokens, hidden])
    graph = helper.make_graph([node], "moe", inputs, [output])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def test_onnxruntime_cpu_moe_ignores_use_sparse_mixer():
    """Measured: the CPU kernel's output is the same with and without use_sparse_mixer, and it
    is not the sparsemixer's; hence the two k=1 nodes of components/sparsemixer.py."""
    rng = np.random.default_rng(0)
    tokens, experts, hidden, inter = 16, 4, 8, 6
    feeds = {
        "x": rng.normal(size=(tokens, hidden)).astype(np.float32),
        "router": rng.normal(size=(tokens, experts)).astype(np.float32),
        "fc1": rng.normal(size=(experts, 2 * inter, hidden)).astype(np.float32),
        "fc2": rng.normal(size=(experts, hidden, inter)).astype(np.float32),
    }
    outputs = []
    for flag in (0, 1):
        session = ort.InferenceSession(
            _moe_node_model(flag, tokens, experts, hidden, inter),
            providers=["CPUExecutionProvider"],
        )
        outputs.append(session.run(None, feeds)[0])
    assert np.array_equal(outputs[0], outputs[1])
    weights, picks = sparsemixer(torch.from_numpy(feeds["router"]), 0.1, training=False)
    expected = np.zeros((tokens, hidden), np.float32)
    for t in range(tokens):
        for weight, e in zip(weights[t].tolist(), picks[t].tolist(), strict=True):
            fused = feeds["fc1"][e] @ feeds["x"][t]
            gate, up = fused[0::2], fused[1::2]
            expected[t] += weight * (feeds["fc2"][e] @ (gate / (1 + np.exp(-gate)) * up))
    assert np.abs(outputs[1] - expected).max() > 1e-2


def test_prompts_exercise_both_sparsemixer_regimes(tmp_path):
    """Tokens pick different pairs, and some picks share their softmax with experts inside the
    2 * eps band (weight < 1) while others stand alone (weight 1)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phimoe", seed=SEED)
    model = load_reference_model(ckpt)
    seen = []
    hooks = [
        layer.mlp.router.register_forward_hook(lambda module, args, out: seen.append(out))
        for layer in model.model.layers
    ]
    with torch.no_grad():
        model(torch.tensor(_ids()))
    for hook in hooks:
        hook.remove()
    pairs = [len({tuple(sorted(row)) for row in picks.tolist()}) for _, _, picks in seen]
    assert min(pairs) >= 2 and max(pairs) >= 4, pairs
    weights = torch.cat([weights for _, weights, _ in seen])
    assert (weights < 1 - 1e-3).sum() >= 10 and (weights > 1 - 1e-6).any()


CASES = {
    "phimoe_longrope_mscales": {"rope_parameters": LONGROPE, "max_position_embeddings": 64},
    "phimoe_without_biases": {"attention_bias": False, "lm_head_bias": False},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_phimoe_graphs_match_transformers(case, tmp_path):
    diffs = case_diffs(tmp_path, "phimoe", _ids(), EPS, seed=SEED, **CASES[case])
    assert max(diffs.values()) <= TOLERANCE, diffs


def _second_pick_without_band(op, scores, mixer):
    """The second pick's router input with only the first pick masked: a softmax over all
    the other experts."""
    first = op.ArgMax(scores, axis=-1, keepdims=1)
    minus_inf = op.CastLike(op.Constant(value_float=float("-inf")), scores)
    return op.ScatterElements(scores, first, op.Expand(minus_inf, op.Shape(first)), axis=-1)


MUTANTS = {
    "eps_halved": ("eps", 0.05),
    "plain_top2_softmax": ("sparse_mixer", None),
    "second_pick_without_band": ("second_pick", _second_pick_without_band),
}


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_sparsemixer_detail_wrong(case, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phimoe", seed=SEED)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=1)
    package = mobius_genai.build(ckpt, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE
    family = FAMILIES["phimoe"]
    reader = family.config_overrides["moe"]
    what, value = MUTANTS[case]

    def mutant(raw):
        moe = reader(raw)
        if what == "eps":
            return dataclasses.replace(moe, sparse_mixer=SparseMixer(eps=value))
        return dataclasses.replace(moe, sparse_mixer=value) if what == "sparse_mixer" else moe

    overrides = {**family.config_overrides, "moe": mutant}
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(FAMILIES, "phimoe", dataclasses.replace(family, config_overrides=overrides))
        if what == "second_pick":
            patch.setattr(components_sparsemixer, "second_pick", value)
        package = mobius_genai.build(ckpt, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "mutant"), reference)
    assert max_abs_diff(ours, reference.logits) > 10 * TOLERANCE


@pytest.mark.parametrize(("ep", "fused"), [("default", True), ("cpu", True), ("cuda", False)])
def test_two_k1_moe_nodes_per_layer_where_fused(ep, fused, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phimoe")
    graph = mobius_genai.build(ckpt, ep, "f32", load_weights=False)["model"].graph
    moe = [node for node in graph if node.op_type == "MoE"]
    assert len(moe) == (6 if fused else 0)
    assert all(node.attributes["k"].as_int() == 1 for node in moe)
    assert all(node.attributes["normalize_routing_weights"].as_int() == 0 for node in moe)


def test_onnx_standard_graph_holds_only_standard_ops(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phimoe")
    graph = mobius_genai.build(ckpt, "onnx-standard", "f32", load_weights=False)["model"].graph
    assert {node.domain for node in graph} == {""}
    assert isinstance(graph, ir.Graph)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts_per_tok": 3}, "'num_experts_per_tok' is 3; accepted: 2"),
        ({"router_jitter_noise": -0.1}, "'router_jitter_noise'"),
        ({"router_jitter_noise": "x"}, "'router_jitter_noise'"),
    ],
)
def test_bad_sparsemixer_config_is_refused(changes, message, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "phimoe")
    edit_config(ckpt, **changes)
    with pytest.raises(ConfigError, match=message):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def test_genai_type_is_phimoe():
    assert FAMILIES["phimoe"].genai_type == "phimoe"
