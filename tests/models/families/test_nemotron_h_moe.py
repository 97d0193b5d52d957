"""Nemotron-3's MoE layers in nemotron_h (transformers' NemotronHMoE): DeepSeek-V3's grouped
sigmoid routing with the correction bias, non-gated relu2 experts run by com.microsoft::MoE
(both rows of each pair the up projection's, config/moe.py's RELU2_ALPHA) and a relu2 shared
expert. Checked against transformers on a layer pattern with every block kind (M, E, *, -, E)
over a 70-token prefill and decode steps on the portable, cpu and onnx-standard graphs, the
hub's pattern with other routing settings, mutants that fail it, onnxruntime-genai's greedy
tokens, and int4 (the experts as QMoE, computing what their codes stand for)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch

import mobius_genai
from mobius_genai import ConfigError, packager
from mobius_genai.components import moe as moe_component
from mobius_genai.components.group_router import GroupRouter
from mobius_genai.components.mlp import FCMLP
from mobius_genai.config import moe as moe_config
from mobius_genai.ep import get_ep
from mobius_genai.models import get_family
from mobius_genai.quantize import Int4Options, quantize_int4
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint
from tests._hf import (
    edit_config,
    hf_greedy_tokens,
    hf_reference_logits,
    load_reference_model,
    router_picks,
    write_tiny_checkpoint,
)
from tests._ort import (
    built_graph_diff,
    long_prefill_reference,
    max_abs_diff,
    mutant_diffs,
    og_sequence,
    ort_session,
    parity_diffs,
    run_like_reference,
)
from tests.quantize.test_qmoe import _dequantized_checkpoint

TOLERANCE = 1e-4  # f32
#: Nemotron-3-Nano's layout, tiny: Mamba2, MoE, attention, MLP, MoE layers; 8 relu2 experts of
#: 32 in 4 groups (2 kept), 2 per token, renormalized then scaled by 2.5; a relu2 shared
#: expert of 48 (not a multiple of the experts' width, as the Nano's 3712 beside 1856)
NEMOTRON3 = {
    "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp", "moe"],
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 48,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
}
MOE_LAYERS = (1, 4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nemotron3") / "ckpt"
    return write_tiny_checkpoint(folder, "nemotron_h", seed=1, **NEMOTRON3)


@pytest.fixture(scope="module")
def long_run(checkpoint):
    """transformers' chunked scan and routing over 70 tokens, then 4 decode steps."""
    return long_prefill_reference(checkpoint)


@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # MoE nodes with their bodies
        ("cpu", {"", "com.microsoft"}),
        ("onnx-standard", {""}),  # the MoE bodies inlined
    ],
)
def test_long_prefill_then_decode_matches_transformers(checkpoint, long_run, ep, domains, tmp_path):
    built, diff = built_graph_diff(checkpoint, long_run, ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


def test_the_moe_layers_are_moe_nodes_of_relu2_experts(checkpoint):
    """One MoE node per "E" layer, its SwiGLU the relu2 form; the experts' fc1 holds each up
    row twice, the shared expert is a plain MLP."""
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    graph = package["model"].graph
    nodes = [node for node in graph if node.op_type == "MoE"]
    assert len(nodes) == len(MOE_LAYERS)
    alpha = nodes[0].attributes["activation_alpha"].as_float()
    assert alpha == moe_config.RELU2_ALPHA
    fc1 = graph.initializers["model.layers.1.mlp.experts.gate_up_proj"].const_value.numpy()
    assert fc1.shape == (8, 64, 64)
    np.testing.assert_array_equal(fc1[:, 0::2], fc1[:, 1::2])
    assert "model.layers.4.mlp.shared_expert.fc1.weight" in graph.initializers


#: float16 graphs against transformers' float32 logits (largest 6.4): measured 0.054
F16_TOLERANCE = 0.1


def test_cuda_float16_graph_runs_the_relu2_experts_in_standard_ops(checkpoint, tmp_path):
    """cuda takes no fused MoE (ep/kernels.py): the node's body is inlined, its alpha a finite
    float16 (65504), so alpha * h overflows to +-inf for |h| > 1 and the sigmoid saturates
    instead of giving NaN; the graph runs on the CPU provider near transformers."""
    package = mobius_genai.build(checkpoint, "cuda", "f16", progress=False)
    assert "MoE" not in {node.op_type for node in package["model"].graph.all_nodes()}
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 24))
    reference = hf_reference_logits(checkpoint, ids, decode_steps=2)
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    assert max_abs_diff(ours, reference.logits) <= F16_TOLERANCE


def test_prompt_routing_spreads_and_depends_on_the_correction_bias(checkpoint, long_run):
    """Over the long prompt each MoE layer picks most experts and many pairs, and without
    e_score_correction_bias (or the group limit) the picks change: the mutants below are
    measured where routing matters."""
    model = load_reference_model(checkpoint)
    ids = long_run.prefill.input_ids
    for layer in MOE_LAYERS:
        gate = model.model.layers[layer].mixer.gate
        picks = router_picks(model, gate, ids)
        assert len({e for pair in picks for e in pair}) >= 7 and len(set(picks)) >= 10, picks
        gate.topk_group = gate.num_group
        assert router_picks(model, gate, ids) != picks
        gate.topk_group = NEMOTRON3["topk_group"]
        with torch.no_grad():
            gate.e_score_correction_bias.zero_()
        assert router_picks(model, gate, ids) != picks


def test_hub_pattern_and_other_routing_settings_match_transformers(tmp_path):
    """The hub's hybrid_override_pattern (a MoE layer first) with num_hidden_layers, one group, raw (not
    renormalized) weights, no scaling, and mlp_bias on the shared expert and MLP layers."""
    ckpt = write_tiny_checkpoint(
        tmp_path / "ckpt",
        "nemotron_h",
        seed=2,
        **{
            **NEMOTRON3,
            "layers_block_type": ["moe", "full_attention", "linear_attention", "mlp", "moe"],
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.0,
            "mlp_bias": True,
        },
    )
    edit_config(ckpt, layers_block_type=None, hybrid_override_pattern="E*M-E", num_hidden_layers=5)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    diffs = parity_diffs(tmp_path, ckpt, ids, decode_steps=3)  # the default and cpu graphs
    assert max(diffs.values()) <= TOLERANCE, diffs


class _CorrectionBiasIgnored(GroupRouter):
    def _choice(self, op, scores):
        return scores


def _relu_shared_expert(moe, config):
    return FCMLP(config.hidden_size, moe.shared_expert_size, "relu", config.mlp_bias)


def _shared_dropped(self, op, x, out):
    """The routed experts alone (the shared expert built, its weights read, times zero)."""
    shared = self.shared_expert(op, x)
    return op.Add(out, op.Mul(shared, op.CastLike(op.Constant(value_float=0.0), shared)))


#: mutant → (module or class, attribute, replacement)
MUTANTS = {
    "routing_without_the_correction_bias": (
        moe_component,
        "GroupRouter",
        _CorrectionBiasIgnored,
    ),
    # the experts' SwiGLU with alpha 1: silu(h) * h instead of relu(h) * h
    "experts_without_the_relu2_alpha": (
        moe_config,
        "EXPERT_FORMS",
        {
            **moe_config.EXPERT_FORMS,
            "relu2": moe_config.ExpertForm(
                gated=False, node_activation=moe_config.ExpertActivation()
            ),
        },
    ),
    "shared_expert_relu_for_relu2": (moe_component, "_shared_expert", _relu_shared_expert),
    "shared_expert_dropped": (moe_component.MoEBlock, "_with_shared_expert", _shared_dropped),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mechanism_changed_fails_parity(checkpoint, mutant, monkeypatch, tmp_path):
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 24))
    ours, changed = mutant_diffs(
        checkpoint, ids, tmp_path, "nemotron_h", MUTANTS[mutant], monkeypatch
    )
    assert ours <= TOLERANCE and not changed <= 10 * TOLERANCE, (ours, changed)


@pytest.mark.parametrize(
    ("changes", "error", "field"),
    [
        ({"mlp_hidden_act": "relu"}, ConfigError, "hidden_act 'relu'"),
        ({"n_group": 3}, ConfigError, "n_group 3"),
    ],
)
def test_a_moe_config_the_row_cannot_build_is_refused_in_one_line(
    checkpoint, changes, error, field
):
    raw = {**json.loads((checkpoint / "config.json").read_text()), **changes}
    with pytest.raises(error, match=field) as raised:
        get_family("nemotron_h").parse_config(raw)
    assert "\n" not in str(raised.value)


def test_a_config_without_mlp_layers_reads_transformers_defaults(checkpoint):
    """NemotronHConfig fills what a MoE model's config.json may leave out: the MLP layers'
    width (21504) and the MoE sizes and routing."""
    raw = json.loads((checkpoint / "config.json").read_text())
    for key in ("intermediate_size", "n_group", "topk_group", "routed_scaling_factor"):
        del raw[key]
    config = get_family("nemotron_h").parse_config(raw)
    assert config.intermediate_size == 21504
    routing = config.moe.group_routing
    assert (routing.groups, routing.top_groups, routing.scaling) == (1, 1, 1.0)
    assert config.moe.sparse_layers == MOE_LAYERS and config.moe.experts == "relu2"


@pytest.fixture(scope="module")
def bundle_config():
    """The bundle tests' config (with the committed tiny-qwen2 tokenizer, vocab 384)."""
    return NEMOTRON3


def test_og_greedy_tokens_equal_transformers(bundle_config, tmp_path):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "nemotron_h", **bundle_config)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    # og.Model and og.Generator as a user runs them (default search: greedy)
    ours = og_sequence(folder, PROMPT, len(PROMPT) + NEW_TOKENS)[len(PROMPT) :]
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS  # no early eos: the comparison covers every step


def test_int4_bundle_runs_the_experts_as_qmoe(bundle_config, tmp_path):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "nemotron_h", **bundle_config)
    int4 = Int4Options(block_size=16)
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=int4, quiet=True
    )
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    qmoe = [node for node in graph.node if node.op_type == "QMoE"]
    assert len(qmoe) == len(MOE_LAYERS)
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in qmoe[0].attribute}
    assert attributes["activation_alpha"] == pytest.approx(moe_config.RELU2_ALPHA)
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


def test_qmoe_computes_the_relu2_experts_its_codes_stand_for(checkpoint, long_run, tmp_path):
    """The QMoE graph equals the same int4 graph whose experts stay float MoE nodes holding
    the dequantized values (the node that matches transformers above)."""
    ckpt = shutil.copytree(checkpoint, tmp_path / "ckpt")
    options = Int4Options(block_size=16, symmetric=True, accuracy_level=0, quality="builder")
    cpu = get_ep("cpu")
    logits = {}
    for name, ep in (("qmoe", cpu), ("float", cpu.with_kernels({"QMoE": False}))):
        if name == "float":
            _dequantized_checkpoint(ckpt, 16, True)
        package = mobius_genai.build(ckpt, ep, "f32", progress=False)
        report = quantize_int4(package.models["model"], options, ep)
        assert ("QMoE" in report.op_counts) == (name == "qmoe")
        logits[name] = run_like_reference(ort_session(package, tmp_path / name), long_run)
    assert max_abs_diff(logits["qmoe"], logits["float"]) <= TOLERANCE
