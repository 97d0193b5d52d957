"""Granite 3's MoE with a shared MLP (granitemoeshared), Hunyuan-A13B (hunyuan_v1_moe: a float32
softmax router beside a shared MLP), dots.llm1 (dots1: DeepSeek-V3's routing with Qwen3's
attention), K-EXAONE (exaone_moe: V3's routing with EXAONE 4's attention in pre-norm
layers) and Solar Open (solar_open: GLM-4 MoE's routing in every layer), vs transformers; with
them FlexOlmo (flex_olmo: olmo2's post-norm layers with olmoe's experts, no shared one).

Each row's tiny checkpoint (tests/_hf.py) is compared in test_moe.py with every MoE row, its
bundle's greedy tokens in test_bundles.py and its float32 router in test_float32.py; here the
switches the rows read, the hub's config layouts, mutants (each wrong routing or shared-MLP
detail moves the logits well past the tolerance, or leaves checkpoint tensors unread), and int4
QMoE bundles. f32, 2 x 12-token prefill + 4 cached decode steps, on the portable, cpu and
onnx-standard graphs.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import mobius_genai
from mobius_genai.components import moe
from mobius_genai.errors import UnsupportedModelError, WeightsError
from mobius_genai.models import FAMILIES
from tests._bundles import int4_bundle_ops
from tests._hf import (
    edit_config,
    hf_reference_logits,
    load_reference_model,
    router_picks,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._mutants import CorrectionBiasIgnored, with_moe, with_routing
from tests._ort import case_diffs, graph_diffs, mutant_diffs
from tests.models.families.test_corrected_moe import _ids

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
ROWS = ("granitemoeshared", "hunyuan_v1_moe", "dots1", "exaone_moe", "solar_open", "flex_olmo")

CASES = {
    # GraniteMoeSharedDecoderLayer without its shared MLP: granitemoe's layer
    "granitemoeshared_no_shared_mlp": ("granitemoeshared", {"shared_intermediate_size": 0}),
    # the hub's per-layer list of picks (all equal), tied embeddings
    "hunyuan_v1_moe_per_layer_topk_tied": (
        "hunyuan_v1_moe",
        {"moe_topk": [2, 2, 2], "tie_word_embeddings": True},
    ),
    # one pick per token: its weight renormalized to 1
    "hunyuan_v1_moe_top1": ("hunyuan_v1_moe", {"moe_topk": 1}),
    # one group, renormalized, no attention biases, no window
    "dots1_one_group_renormalized": (
        "dots1",
        {
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": True,
            "attention_bias": False,
            "sliding_window": None,
        },
    ),
    # raw weights times their sum's factor, no attention biases, tied embeddings
    "solar_open_raw_weights_tied": (
        "solar_open",
        {"norm_topk_prob": False, "attention_bias": False, "tie_word_embeddings": True},
    ),
    # sliding, sliding, full (NoPE) layers; experts in the outer layers (mlp_layer_types); raw
    # weights in one group
    "exaone_moe_pattern_3_outer_experts_raw": (
        "exaone_moe",
        {
            "sliding_window_pattern": 3,
            "mlp_layer_types": ["sparse", "dense", "sparse"],
            "norm_topk_prob": False,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_shared_expert_rows_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    diffs = case_diffs(tmp_path, family, _ids(), EPS, seed=1, **overrides)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_prompt_routes_hunyuan_tokens_to_different_experts(tmp_path):
    """The parity prompts exercise Hunyuan's router: the first layer's picks differ between
    tokens, so a routing mutant below is measured where routing matters."""
    model = load_reference_model(write_tiny_checkpoint(tmp_path / "ckpt", "hunyuan_v1_moe", seed=1))
    picks = router_picks(model, model.model.layers[0].mlp.gate, _ids())
    assert len(set(picks)) >= 4, picks


def test_dots1_hub_layout_slides_from_max_window_layers(tmp_path):
    """dots.llm1's config.json has no layer_types: the layers from max_window_layers on slide,
    as Dots1Config fills them, and the logits follow transformers'."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "dots1", seed=1)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    data = json.loads((ckpt / "config.json").read_text())
    expected = tuple(data.pop("layer_types"))
    (ckpt / "config.json").write_text(json.dumps(data))
    assert FAMILIES["dots1"].parse_config(data).layer_types == expected
    assert expected[-1] == "sliding_attention"
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


def test_hunyuan_per_layer_values_that_differ_are_refused(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "hunyuan_v1_moe")
    edit_config(ckpt, moe_topk=[2, 1, 2])
    with pytest.raises(UnsupportedModelError, match=r"num_experts_per_tok is \[2, 1, 2\]"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


MUTANTS = {
    "hunyuan_v1_moe_not_renormalized": (
        "hunyuan_v1_moe",
        with_moe(FAMILIES["hunyuan_v1_moe"], normalize_top_k=False),
    ),
    "dots1_correction_bias_ignored": ("dots1", (moe, "GroupRouter", CorrectionBiasIgnored)),
    "dots1_groups_not_limited": ("dots1", with_routing("dots1", top_groups=4)),
    "dots1_routed_scaling_ignored": ("dots1", with_routing("dots1", scaling=1.0)),
    "solar_open_groups_not_limited": ("solar_open", with_routing("solar_open", top_groups=4)),
    "exaone_moe_correction_bias_ignored": (
        "exaone_moe",
        (moe, "GroupRouter", CorrectionBiasIgnored),
    ),
    # EXAONE 4's global layer rotated as its sliding ones are
    "exaone_moe_global_layer_rotated": (
        "exaone_moe",
        dataclasses.replace(
            FAMILIES["exaone_moe"],
            config_overrides={**FAMILIES["exaone_moe"].config_overrides, "no_rope_layers": ()},
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_detail_wrong(case, tmp_path, monkeypatch):
    family, mutant = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    ours, mutated = mutant_diffs(ckpt, _ids(), tmp_path, family, mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


@pytest.mark.parametrize(
    ("family", "unread"),
    [
        ("granitemoeshared", "model.layers.0.shared_mlp.input_linear.weight"),
        ("hunyuan_v1_moe", "model.layers.0.mlp.shared_mlp.down_proj.weight"),
    ],
)
def test_a_row_without_its_shared_mlp_leaves_it_unread_and_is_refused(
    family, unread, tmp_path, monkeypatch
):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    monkeypatch.setitem(FAMILIES, family, with_moe(FAMILIES[family], shared_expert_size=0))
    with pytest.raises(WeightsError, match=unread):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_flex_olmo_read_as_olmoe_pre_norm_layers_is_refused(tmp_path, monkeypatch):
    """FlexOlmo's layers normalize the attention's and the experts' outputs (olmo2's post
    norms), which also hides the renormalization of the top-k weights; read with olmoe's
    pre-norm layers, the checkpoint lacks their input norms."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "flex_olmo")
    row = FAMILIES["flex_olmo"]
    overrides = {**row.config_overrides, "norm_placement": "pre"}
    monkeypatch.setitem(FAMILIES, "flex_olmo", dataclasses.replace(row, config_overrides=overrides))
    with pytest.raises(WeightsError, match=r"input_layernorm"):
        mobius_genai.build(ckpt, "cpu", "f32")


@pytest.mark.parametrize("family", ROWS)
def test_cpu_int4_bundle_runs_its_experts_as_qmoe(family, tmp_path):
    """int4 for cpu: every MoE layer's routed experts in QMoE, and onnxruntime-genai generates
    every token asked for."""
    ops = int4_bundle_ops(family, tmp_path)
    config = FAMILIES[family].parse_config(tiny_config(family).to_dict())
    assert (ops["QMoE"], ops["MoE"]) == (len(config.moe.sparse_layers), 0)
    assert ops["MatMulNBits"] > 0
