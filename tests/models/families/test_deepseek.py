"""DeepSeek-V2/V3: multi-head latent attention and group-limited MoE routing vs transformers.

Each row's defaults (tests/_hf.py: low-rank or plain q, yarn rope with DeepSeek's mscales,
v_head_dim below the q/k head size, a latent cache, 8 experts in groups, a dense first layer) are compared
in test_moe.py with every MoE row; here the switches the rows read, and mutants: each wrong
detail must move the logits well past the tolerance. f32, 2 x 12-token prefill + 4 cached
decode steps, on the portable, cpu (GroupQueryAttention, the MoE kernel) and onnx-standard
(standard ops only) graphs.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import mobius_genai
from mobius_genai import packager
from mobius_genai.components import decoder, moe
from mobius_genai.components.latent_attention import LatentAttention
from mobius_genai.errors import ConfigError, UnsupportedModelError, WeightsError
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.deepseek import v3_moe
from tests._bundles import bundle_checkpoint, int4_bundle_ops
from tests._hf import (
    edit_config,
    hf_reference_logits,
    load_reference_model,
    router_picks,
    write_tiny_checkpoint,
)
from tests._mutants import CorrectionBiasIgnored, with_routing
from tests._ort import case_diffs, graph_diffs, mutant_diffs

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
_DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

CASES = {
    # q_proj instead of the low-rank q; V3's rotate_half layout (rope_interleave false)
    "deepseek_v3_one_q_proj_rotate_half": (
        "deepseek_v3",
        {"q_lora_rank": None, "rope_interleave": False},
    ),
    # raw weights times their sum's factor; every group kept; biased q_a/kv_a/o projections
    "deepseek_v3_not_renormalized_all_groups_attention_bias": (
        "deepseek_v3",
        {"norm_topk_prob": False, "topk_group": 4, "attention_bias": True},
    ),
    # values wider than the q/k heads and than the latent cache's head
    "deepseek_v3_values_wider_than_keys": ("deepseek_v3", {"v_head_dim": 48}),
    # DeepseekV3MLP has no biases whatever mlp_bias says (V2's would have: refused)
    "deepseek_v3_ignores_mlp_bias": ("deepseek_v3", {"mlp_bias": True}),
    # softmax top-k over every expert, low-rank q, plain rope (no mscale in the softmax scale)
    "deepseek_v2_greedy_low_rank_q": (
        "deepseek_v2",
        {"topk_method": "greedy", "q_lora_rank": 16, "rope_parameters": _DEFAULT_ROPE},
    ),
    # Glm4MoeLiteConfig's default layers (the first dense), plain rope, rotate_half layout
    "glm4_moe_lite_default_layers_rotate_half": (
        "glm4_moe_lite",
        {"mlp_layer_types": None, "rope_parameters": _DEFAULT_ROPE, "rope_interleave": False},
    ),
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


@pytest.mark.parametrize("case", sorted(CASES))
def test_deepseek_graphs_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    diffs = case_diffs(tmp_path, family, _ids(), EPS, seed=1, **overrides)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_hub_layout_config_matches_transformers(tmp_path):
    """DeepSeek-V2-Lite's config.json: rope_scaling of type yarn, no head_dim or qk_head_dim."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "deepseek_v2", seed=1, hub_layout=True)
    data = json.loads((ckpt / "config.json").read_text())
    assert data["rope_scaling"]["rope_type"] == "yarn"
    for key in ("head_dim", "qk_head_dim"):
        data.pop(key)
    (ckpt / "config.json").write_text(json.dumps(data))
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


def _picks(model, ids: np.ndarray) -> list[tuple[int, ...]]:
    """The experts the first MoE layer (layer 1) picks for each token."""
    return router_picks(model, model.model.layers[1].mlp.gate, ids)


def test_prompt_routing_depends_on_the_correction_bias_and_the_groups(tmp_path):
    """The parity prompts pick many expert pairs, and the picks change without V3's correction
    bias or V2's group limit: the mutants below are measured where routing matters."""
    v3 = load_reference_model(write_tiny_checkpoint(tmp_path / "v3", "deepseek_v3", seed=1))
    picks = _picks(v3, _ids())
    assert len(set(picks)) >= 6, picks
    with torch.no_grad():
        v3.model.layers[1].mlp.gate.e_score_correction_bias.zero_()
    assert _picks(v3, _ids()) != picks
    v2 = load_reference_model(write_tiny_checkpoint(tmp_path / "v2", "deepseek_v2", seed=1))
    picks = _picks(v2, _ids())
    v2.model.layers[1].mlp.gate.topk_group = 2
    assert _picks(v2, _ids()) != picks


class _RopeOnTheFirstChannels(LatentAttention):
    """Rotates each query head's first qk_rope_head_dim channels instead of its last."""

    def _query_slices(self, op, q):
        sizes = [self.mla.qk_rope_head_dim, self.mla.qk_nope_head_dim]
        rope, nope = op.Split(q, op.Constant(value_ints=sizes), axis=-1, _outputs=2)
        return nope, rope


def _without_mscale(family: str):
    row = FAMILIES[family]
    overrides = {**row.config_overrides, "attention_scale": lambda raw: 24**-0.5}
    return dataclasses.replace(row, config_overrides=overrides)


MUTANTS = {
    "rope_on_the_wrong_slice": (
        "deepseek_v3",
        (decoder, "LatentAttention", _RopeOnTheFirstChannels),
    ),
    "correction_bias_ignored": ("deepseek_v3", (moe, "GroupRouter", CorrectionBiasIgnored)),
    "v3_groups_not_limited": ("deepseek_v3", with_routing("deepseek_v3", top_groups=4)),
    "v3_routed_scaling_ignored": ("deepseek_v3", with_routing("deepseek_v3", scaling=1.0)),
    "v2_groups_not_limited": ("deepseek_v2", with_routing("deepseek_v2", top_groups=2)),
    "v2_softmax_scale_without_mscale": ("deepseek_v2", _without_mscale("deepseek_v2")),
}


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_detail_wrong(case, tmp_path, monkeypatch):
    family, mutant = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    ours, mutated = mutant_diffs(ckpt, _ids(), tmp_path, family, mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


def test_glm4_moe_lite_layers_read_as_v3_first_dense_ones_are_refused(tmp_path, monkeypatch):
    """mlp_layer_types decides which layers hold experts: read as DeepSeek-V3's
    first_k_dense_replace (absent: none dense), the dense middle layer's experts are missing."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "glm4_moe_lite")
    row = FAMILIES["glm4_moe_lite"]
    mutant = dataclasses.replace(row, config_overrides={**row.config_overrides, "moe": v3_moe})
    monkeypatch.setitem(FAMILIES, "glm4_moe_lite", mutant)
    with pytest.raises(WeightsError, match=r"model\.layers\.1\.mlp\.experts"):
        mobius_genai.build(ckpt, "cpu", "f32")


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
def test_every_ep_caches_one_latent_head(family, tmp_path):
    """The cache is the latent: one key/value head of kv_lora_rank + qk_rope_head_dim (32 + 8)
    channels, og 0.18's decoder contract (genai_config says so); cpu attends with
    GroupQueryAttention in every layer, onnx-standard with standard ops only."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    for ep, attention in (("cpu", "GroupQueryAttention"), ("onnx-standard", "Attention")):
        graph = mobius_genai.build(ckpt, ep, "f32", load_weights=False)["model"].graph
        assert [node.op_type for node in graph].count(attention) == 3, ep
        if ep == "onnx-standard":
            assert {node.domain for node in graph} == {""}
        caches = [value for value in graph.inputs if value.name.startswith("past_key_values")]
        assert len(caches) == 6
        assert {(value.shape[1], value.shape[3]) for value in caches} == {(1, 40)}
    folder = packager.package(
        bundle_checkpoint(tmp_path / "og", family), "cpu", tmp_path / "bundle", quiet=True
    )
    decoder_config = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    assert (decoder_config["num_key_value_heads"], decoder_config["head_size"]) == (1, 40)


def _refused(tmp_path, family: str, error: type[Exception], match: str, **changes) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    edit_config(ckpt, **changes)
    with pytest.raises(error, match=match):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


REFUSALS = {
    "v2_topk_method": (
        "deepseek_v2",
        UnsupportedModelError,
        "topk_method is 'noaux_tc'",
        {"topk_method": "noaux_tc"},
    ),
    "v2_mlp_bias": ("deepseek_v2", UnsupportedModelError, "mlp_bias", {"mlp_bias": True}),
    "groups_not_dividing_experts": (
        "deepseek_v3",
        ConfigError,
        "n_group 3 does not divide the 8 experts",
        {"n_group": 3},
    ),
    "kept_groups_too_small": (
        "deepseek_v3",
        ConfigError,
        "topk_group 1 groups of 2 experts cannot hold num_experts_per_tok 3",
        {"topk_group": 1, "num_experts_per_tok": 3},
    ),
    "odd_rope_slice": (
        "deepseek_v3",
        ConfigError,
        "'qk_rope_head_dim' is 7",
        {"qk_rope_head_dim": 7},
    ),
    "glm4_moe_lite_mlp_layer_types": (
        "glm4_moe_lite",
        ConfigError,
        "mlp_layer_types is \\['sparse', 'moe', 'dense'\\]",
        {"mlp_layer_types": ["sparse", "moe", "dense"]},
    ),
    "glm4_moe_lite_partial_rope_slice": (
        "glm4_moe_lite",
        UnsupportedModelError,
        "partial_rotary_factor is 0.5",
        {"partial_rotary_factor": 0.5},
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_the_rows_cannot_build_is_refused_in_one_line(case, tmp_path):
    family, error, match, changes = REFUSALS[case]
    _refused(tmp_path, family, error, match, **changes)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2", "glm4_moe_lite"])
def test_cpu_int4_bundle_runs_its_experts_as_qmoe(family, tmp_path):
    """int4 for cpu: the routed experts of both MoE layers in QMoE (behind the group-limited
    router's standard ops), and onnxruntime-genai generates every token asked for."""
    ops = int4_bundle_ops(family, tmp_path)
    assert (ops["QMoE"], ops["MoE"]) == (2, 0)
    assert ops["MatMulNBits"] > 0
