"""AFMoE, A.X-K1, MiniCPM5-MoE, Kolibri-1, Flint and Hy3: MoE rows derived from ours
(models/families/derived_moe_rows.py), vs transformers.

Each row's defaults are compared with its config class in test_defaults.py and its logits
(2 x 12-token prefill + 4 cached decode steps, f32, portable, cpu and onnx-standard graphs)
in test_moe.py, which takes every MoE row; og's greedy tokens in test_bundles.py (slow). Here:
the layouts beside the defaults, a left-padded batch, a mutant per difference from the parent
row (each moves the logits well past the tolerance, or leaves a checkpoint tensor unread, which
the build refuses), the layouts refused in one line, the GPU EPs' graphs and int4 QMoE bundles
on cpu.
"""

from __future__ import annotations

import numpy as np
import pytest

import mobius_genai
from mobius_genai.components import attention, moe
from mobius_genai.errors import UnsupportedModelError, WeightsError
from mobius_genai.models import FAMILIES
from tests._bundles import (
    bundle_checkpoint,
    check_bundle_generates_like_transformers,
    int4_bundle_ops,
)
from tests._hf import edit_config, tiny_config, write_tiny_checkpoint
from tests._mutants import CorrectionBiasIgnored, with_moe, with_overrides, with_routing
from tests._ort import case_diffs, left_padded_diffs, mutant_diffs

TOLERANCE = 1e-4
EPS = ("default", "cpu")
ROWS = ("afmoe", "axk1", "minicpm5_moe", "kolibri1", "flint", "hy_v3")

CASES = {
    # muP's embedding scale; every layer sliding (no NoPE layer), two dense layers
    "afmoe_mup_all_sliding": (
        "afmoe",
        {"mup_enabled": True, "global_attn_every_n_layers": 4, "num_dense_layers": 2},
    ),
    # the hub's layout: first_k_dense_replace and moe_layer_freq, no mlp_layer_types
    "axk1_every_second_layer_sparse": (
        "axk1",
        {"mlp_layer_types": None, "first_k_dense_replace": 0, "moe_layer_freq": 2},
    ),
    "kolibri1_renormalized": ("kolibri1", {"norm_topk_prob": True}),
    "flint_not_renormalized": ("flint", {"norm_topk_prob": False}),
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_derived_moe_layouts_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    diffs = case_diffs(tmp_path, family, _ids(), EPS, seed=1, **overrides)
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=[] if f == "afmoe" else [pytest.mark.slow]) for f in ROWS]
)
def test_left_padded_batch_matches_transformers(family, tmp_path):
    """A batch whose first row is left-padded by 4: the padding moves no position, no window
    and no router pick of the real tokens."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=2)
    first, rest = left_padded_diffs(ckpt, tmp_path / "onnx")
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


def _query_gate_dropped(self, op, q):
    """Attention._gated_query that splits q_proj's gates off and drops them."""
    q, _ = _GATED_QUERY(self, op, q)
    return q, None


def _own_gate_dropped(self, op, output, x):
    """Attention._gated_output that projects the gate (g_proj is read) and drops it."""
    self.g_proj(op, x)
    return output


_GATED_QUERY = attention.Attention._gated_query
_QUERY_GATE_DROPPED = (attention.Attention, "_gated_query", _query_gate_dropped)
_OWN_GATE_DROPPED = (attention.Attention, "_gated_output", _own_gate_dropped)
_BIAS_IGNORED = (moe, "GroupRouter", CorrectionBiasIgnored)


MUTANTS = {
    "afmoe_output_gate_dropped": ("afmoe", _OWN_GATE_DROPPED),
    "afmoe_rotary_in_full_layers": ("afmoe", with_overrides("afmoe", no_rope_layers=())),
    "afmoe_expert_bias_ignored": ("afmoe", _BIAS_IGNORED),
    "afmoe_route_scale_ignored": ("afmoe", with_routing("afmoe", scaling=1.0)),
    "minicpm5_moe_output_gate_dropped": ("minicpm5_moe", _QUERY_GATE_DROPPED),
    "kolibri1_chosen_by_scores": ("kolibri1", with_routing("kolibri1", choice_by_logits=False)),
    "kolibri1_expert_bias_ignored": ("kolibri1", _BIAS_IGNORED),
    "kolibri1_rotary_in_full_layers": ("kolibri1", with_overrides("kolibri1", no_rope_layers=())),
    "flint_softmax_scores": ("flint", with_routing("flint", scoring="softmax")),
    "flint_rotary_in_full_layers": ("flint", with_overrides("flint", no_rope_layers=())),
    "hy_v3_correction_bias_ignored": ("hy_v3", _BIAS_IGNORED),
    "hy_v3_not_scaled": ("hy_v3", with_routing("hy_v3", scaling=1.0)),
}
#: One mutant of each mechanism these rows add run by default; the others are slow.
_DEFAULT_MUTANTS = ("afmoe_output_gate_dropped", "kolibri1_chosen_by_scores")


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, marks=[] if case in _DEFAULT_MUTANTS else [pytest.mark.slow])
        for case in sorted(MUTANTS)
    ],
)
def test_parity_fails_with_one_difference_dropped(case, tmp_path, monkeypatch):
    family, mutant = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    ours, mutated = mutant_diffs(ckpt, _ids(), tmp_path, family, mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


def test_axk1_without_its_moe_output_norm_leaves_the_norm_unread(tmp_path, monkeypatch):
    """A.X-K1's MoE output norm (post_mlp_layernorm of the sparse layers) is read: a row
    without it is refused before any graph runs."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "axk1", seed=1)
    monkeypatch.setitem(FAMILIES, "axk1", with_moe(FAMILIES["axk1"], output_norm=False))
    with pytest.raises(WeightsError, match=r"reads no tensor .*'model\.layers\.1\.post_mlp_"):
        mobius_genai.build(ckpt, "default", "f32", progress=False)


def test_axk1_sparse_layers_and_norms_follow_the_config_class():
    raw = tiny_config("axk1", mlp_layer_types=None, first_k_dense_replace=1).to_dict()
    config = FAMILIES["axk1"].parse_config(raw)
    assert config.moe.sparse_layers == (1, 2) and config.moe.output_norm
    assert config.latent_attention.q_lora_rank == 32


@pytest.mark.parametrize(
    ("family", "changes", "message"),
    [
        ("axk1", {"q_lora_rank": None}, "q_lora_rank is None; axk1 models are supported"),
        ("hy_v3", {"mlp_bias": True}, "mlp_bias is True; hy_v3 models are supported only"),
        (
            "minicpm5_moe",
            {"use_gated_attention": False},
            "use_gated_attention is False; minicpm5_moe models are supported only with gated",
        ),
    ],
)
def test_layouts_the_rows_do_not_build_are_refused(family, changes, message, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    edit_config(ckpt, **changes)
    with pytest.raises(UnsupportedModelError, match=message):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False, progress=False)


def test_hy_v3_multi_token_prediction_layer_is_not_read(tmp_path):
    """Hy3-preview ships a multi-token-prediction layer after its layers (transformers
    ignores model.layers.80.*)."""
    from safetensors.numpy import load_file, save_file

    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "hy_v3", seed=1)
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.80.eh_proj.weight"] = np.ones((4, 4), np.float32)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    mobius_genai.build(ckpt, "cpu", "f32", progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", ROWS)
def test_bundle_generates_like_transformers_alone_and_in_a_batch(family, tmp_path, capsys):
    """og's greedy tokens of each row's cpu bundle (output gates, sliding NoPE layers,
    sinks, the MoE output norm, the routers) equal transformers', alone and for a batch of
    prompts of different lengths."""
    check_bundle_generates_like_transformers(
        bundle_checkpoint(tmp_path / "ckpt", family), tmp_path, capsys
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", ROWS)
def test_cpu_int4_bundle_runs_its_experts_as_qmoe(family, tmp_path):
    """int4 for cpu: every MoE layer's routed experts in QMoE, the linear weights in
    MatMulNBits, and onnxruntime-genai generates every token asked for."""
    ops = int4_bundle_ops(family, tmp_path)
    config = FAMILIES[family].parse_config(tiny_config(family).to_dict())
    assert (ops["QMoE"], ops["MoE"]) == (len(config.moe.sparse_layers), 0)
    assert ops["MatMulNBits"] > 0


def _gpu_param(family: str, ep: str):
    """cuda's graph of the gate projection's and the sinks' rows by default; the rest slow."""
    default = ep == "cuda" and family in ("afmoe", "flint")
    return pytest.param(family, ep, marks=[] if default else [pytest.mark.slow])


@pytest.mark.parametrize(
    ("family", "ep"), [_gpu_param(f, ep) for f in ROWS for ep in ("cuda", "dml", "webgpu")]
)
def test_gpu_ep_graphs_attend_with_group_query_attention(family, ep, tmp_path):
    """Every layer's attention fuses into GroupQueryAttention (NoPE layers, output gates,
    latent attention included), but Flint's sinks where the EP's GQA takes none (dml,
    webgpu: standard Attention); the experts' MoE node is expanded where the EP lacks it."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    graph = mobius_genai.build(ckpt, ep, "f16", load_weights=False, progress=False)["model"].graph
    ops = [node.op_type for node in graph]
    standard = family == "flint" and ep != "cuda"
    assert ops.count("GroupQueryAttention") == (0 if standard else 3)
    assert ops.count("Attention") == (3 if standard else 0)
    assert ops.count("SkipSimplifiedLayerNormalization") > 0
