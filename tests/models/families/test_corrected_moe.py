"""GLM-4 MoE, ERNIE-4.5-MoE and MiniMax-M2: routers that choose experts by scores plus a learned
correction bias, vs transformers.

Each row's defaults (tests/_hf.py) are compared in test_moe.py with every MoE row; here the
switches the rows read, the hub's config layout, mutants (each wrong routing detail moves the
logits well past the tolerance), og's greedy tokens and int4 QMoE bundles. f32, 2 x 12-token
prefill + 4 cached decode steps, on the portable, cpu and onnx-standard graphs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import mobius_genai
from mobius_genai.components import moe
from mobius_genai.errors import UnsupportedModelError, WeightsError
from mobius_genai.models import FAMILIES
from tests._bundles import int4_bundle_ops
from tests._hf import (
    edit_config,
    hf_reference_logits,
    load_reference_model,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._mutants import CorrectionBiasIgnored, with_moe, with_routing
from tests._ort import case_diffs, graph_diffs, mutant_diffs

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
ROWS = ("glm4_moe", "ernie4_5_moe", "minimax_m2")

CASES = {
    # one group, raw weights (not renormalized), no q/k norm, no attention biases
    "glm4_moe_one_group_raw_weights": (
        "glm4_moe",
        {
            "use_qk_norm": False,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
            "attention_bias": False,
        },
    ),
    # experts in every second layer from the first on, up to the second; tied embeddings
    "ernie4_5_moe_interval_and_end_tied": (
        "ernie4_5_moe",
        {
            "moe_layer_interval": 2,
            "moe_layer_start_index": 0,
            "moe_layer_end_index": 1,
            "tie_word_embeddings": True,
        },
    ),
    "minimax_m2_full_rotary": ("minimax_m2", {"partial_rotary_factor": 1.0}),
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrected_moe_graphs_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    diffs = case_diffs(tmp_path, family, _ids(), EPS, seed=1, **overrides)
    assert max(diffs.values()) <= TOLERANCE, diffs


def _rewrite_tensors(ckpt, change) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    change(tensors)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_glm4_moe_hub_layout_and_its_mtp_layer(tmp_path):
    """GLM-4.5-Air's config.json (rope_theta, partial_rotary_factor at the top level) and
    its multi-token-prediction layer 46, which the decoder does not read."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "glm4_moe", seed=1)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    data = json.loads((ckpt / "config.json").read_text())
    rope = data.pop("rope_parameters")
    data.update(rope_theta=rope["rope_theta"], partial_rotary_factor=rope["partial_rotary_factor"])
    (ckpt / "config.json").write_text(json.dumps(data))
    mtp = "model.layers.46.eh_proj.weight"
    _rewrite_tensors(ckpt, lambda t: t.update({mtp: np.ones((64, 128), np.float32)}))
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs
    _rewrite_tensors(ckpt, lambda t: t.update({"model.layers.45.eh_proj.weight": t.pop(mtp)}))
    with pytest.raises(WeightsError, match="model.layers.45.eh_proj.weight"):
        mobius_genai.build(ckpt, "cpu", "f32")


def test_minimax_m2_hub_layout_rotary_dim(tmp_path):
    """MiniMax-M2's config.json names the rotated channels `rotary_dim` (8 of head_dim 16)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "minimax_m2", seed=1)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    data = json.loads((ckpt / "config.json").read_text())
    rope = data.pop("rope_parameters")
    data.update(rope_theta=rope["rope_theta"], rotary_dim=8)
    (ckpt / "config.json").write_text(json.dumps(data))
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


def test_ernie4_5_moe_mtp_block_is_not_read_and_biases_are_refused(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "ernie4_5_moe", seed=1)
    _rewrite_tensors(ckpt, lambda t: t.update({"model.mtp_linear_proj.0.weight": np.ones(4)}))
    mobius_genai.build(ckpt, "cpu", "f32")
    edit_config(ckpt, use_bias=True)
    with pytest.raises(UnsupportedModelError, match="use_bias is True"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def _routers(model) -> list[torch.nn.Module]:
    """The routers of the MoE layers of a transformers model."""
    return [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]


def _bias(router) -> torch.Tensor:
    """The correction bias transformers keeps on the router, its statics or the MoE block."""
    for owner in (router, getattr(router, "moe_statics", None)):
        if owner is not None and hasattr(owner, "e_score_correction_bias"):
            return owner.e_score_correction_bias
    raise AssertionError(f"no correction bias in {router}")


@pytest.mark.parametrize("family", ROWS)
def test_prompt_picks_depend_on_the_correction_bias(family, tmp_path):
    """The parity prompts pick different experts once the correction bias is zeroed: the
    mutants below are measured where the bias matters."""
    model = load_reference_model(write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1))
    picks = []
    hooks = [
        router.register_forward_hook(lambda module, args, out: picks.append(out[-1]))
        for router in _routers(model)
    ]
    if family == "minimax_m2":  # its bias lives on the block and is passed to the router
        biases = [layer.mlp.e_score_correction_bias for layer in model.model.layers]
    else:
        biases = [_bias(router) for router in _routers(model)]
    with torch.no_grad():
        model(torch.tensor(_ids()))
        before = [p.sort(dim=-1).values for p in picks]
        picks.clear()
        for bias in biases:
            bias.zero_()
        model(torch.tensor(_ids()))
    for hook in hooks:
        hook.remove()
    after = [p.sort(dim=-1).values for p in picks]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


MUTANTS = {
    **{
        f"{family}_correction_bias_ignored": (family, (moe, "GroupRouter", CorrectionBiasIgnored))
        for family in ROWS
    },
    "glm4_moe_groups_not_limited": ("glm4_moe", with_routing("glm4_moe", top_groups=4)),
    "ernie4_5_moe_sigmoid_scores": (
        "ernie4_5_moe",
        with_routing("ernie4_5_moe", scoring="sigmoid"),
    ),
    "minimax_m2_not_renormalized": (
        "minimax_m2",
        with_moe(FAMILIES["minimax_m2"], normalize_top_k=False),
    ),
}


@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_with_one_detail_wrong(case, tmp_path, monkeypatch):
    family, mutant = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    ours, mutated = mutant_diffs(ckpt, _ids(), tmp_path, family, mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


@pytest.mark.parametrize("family", ROWS)
def test_cpu_int4_bundle_runs_its_experts_as_qmoe(family, tmp_path):
    """int4 for cpu: every MoE layer's routed experts in QMoE behind the corrected router's
    standard ops, and onnxruntime-genai generates every token asked for."""
    ops = int4_bundle_ops(family, tmp_path)
    config = FAMILIES[family].parse_config(tiny_config(family).to_dict())
    assert (ops["QMoE"], ops["MoE"]) == (len(config.moe.sparse_layers), 0)
    assert ops["MatMulNBits"] > 0
