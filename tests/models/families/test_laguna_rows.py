"""Laguna, Mellum and MiMo-V2-Flash (models/families/laguna_rows.py) against transformers.

Logits of a 2 x 12-token prefill and 4 cached decode steps on the portable and cpu graphs
(f32, <= 1e-4): sliding and full layers, each type its own rope (Laguna's full layers turn half
of each head), Laguna's softplus output gates (per head, per channel) and its capped sigmoid
routing beside the shared MLP, Mellum's softmax routing around a dense layer, MiMo's narrower
scaled values, its full layers' fewer key/value heads and its sliding layers' sinks
(config/head_layout.py); a left-padded batch; mutants (each mechanism undone moves the logits well past the tolerance); the layouts
refused in one line; GPU EP graphs; int4 on cpu; og's greedy tokens (slow).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mobius_genai
from mobius_genai import UnsupportedModelError
from mobius_genai.components import attention, head_layout
from mobius_genai.config.attention_gate import AttentionGate
from mobius_genai.models import FAMILIES
from tests._bundles import (
    bundle_checkpoint,
    check_bundle_generates_like_transformers,
    int4_bundle_ops,
)
from tests._hf import tiny_config, write_tiny_checkpoint
from tests._mutants import with_overrides, with_routing
from tests._ort import case_diffs, left_padded_diffs, mutant_diffs

TOLERANCE = 1e-4
EPS = ("default", "cpu")

CASES = {
    "laguna": ("laguna", {}),
    # one gate per channel, no router cap, unscaled routing, biased attention projections
    "laguna_per_element_gate": (
        "laguna",
        {
            "gating": "per-element",
            "moe_router_logit_softcapping": 0.0,
            "moe_routed_scaling_factor": 1.0,
            "attention_bias": True,
        },
    ),
    "mellum": ("mellum", {}),
    "mimo_v2_flash": ("mimo_v2_flash", {}),
    # values as wide as keys, unscaled; biased q/k/v projections; one group
    "mimo_v2_flash_even_heads": (
        "mimo_v2_flash",
        {
            "v_head_dim": 24,
            "attention_value_scale": None,
            "attention_bias": True,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


#: Cases and mutants beyond each mechanism's first, left to `pytest -m slow` (CI's budget).
_SLOW = ("mimo_v2_flash_even_heads", "laguna_routed_sum_unscaled", "mellum_one_rope")


def _cases(table: dict) -> list:
    return [
        pytest.param(case, marks=[pytest.mark.slow] if case in _SLOW else [])
        for case in sorted(table)
    ]


@pytest.mark.parametrize("case", _cases(CASES))
def test_graphs_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    diffs = case_diffs(tmp_path, family, _ids(), EPS, seed=1, **overrides)
    assert max(diffs.values()) <= TOLERANCE, diffs


ROWS = ("laguna", "mellum", "mimo_v2_flash")


@pytest.mark.parametrize("family", ROWS)
def test_left_padded_batch_matches_transformers(family, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=2)
    first, rest = left_padded_diffs(ckpt, tmp_path / "onnx")
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


# mechanism → (family, the row with it undone)
MUTANTS = {
    "laguna_gate_as_sigmoid": (
        "laguna",
        lambda: with_overrides("laguna", attention_gate=AttentionGate(activation="sigmoid")),
    ),
    "laguna_router_uncapped": ("laguna", lambda: with_routing("laguna", logit_softcap=0.0)),
    "laguna_routed_sum_unscaled": ("laguna", lambda: with_routing("laguna", scaling=1.0)),
    "laguna_one_rope": ("laguna", lambda: with_overrides("laguna", rope_local=None)),
    "mellum_one_rope": ("mellum", lambda: with_overrides("mellum", rope_local=None)),
    "mimo_v2_flash_unscaled_values": (
        "mimo_v2_flash",
        lambda: _layout(value_scale=1.0),
    ),
    # each full layer's key/value heads tiled (0, 1, 0, 1) instead of repeated in a row
    "mimo_v2_flash_heads_tiled": (
        "mimo_v2_flash",
        lambda: (head_layout, "_repeated", _tiled),
    ),
    "mimo_v2_flash_without_sinks": (
        "mimo_v2_flash",
        lambda: (attention, "apply_sinks", lambda op, output, *rest: output),
    ),
}


def _layout(**changes):
    read = FAMILIES["mimo_v2_flash"].config_overrides["head_layout"]
    return with_overrides(
        "mimo_v2_flash", head_layout=lambda raw: dataclasses.replace(read(raw), **changes)
    )


def _tiled(op, x, stored, repeats, head_dim):
    """The mutant's repetition: the stored heads' block `repeats` times."""
    return op.Tile(x, op.Constant(value_ints=[1, 1, repeats]))


@pytest.mark.parametrize("case", _cases(MUTANTS))
def test_parity_fails_without_the_mechanism(case, tmp_path, monkeypatch):
    family, mutant = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 12))
    ours, theirs = mutant_diffs(ckpt, ids, tmp_path, family, mutant(), monkeypatch)
    assert ours <= TOLERANCE < theirs / 10, (ours, theirs)


@pytest.mark.parametrize(
    ("family", "switches", "message"),
    [
        (
            "laguna",
            {"num_attention_heads_per_layer": [4, 8, 4]},
            r"num_attention_heads_per_layer is \[4, 8, 4\]; laguna models are supported only "
            r"with num_attention_heads \(4\) in every layer",
        ),
        ("laguna", {"gating": "per-token"}, "gating is 'per-token'; laguna models are supported"),
    ],
)
def test_layouts_without_a_component_are_refused_in_one_line(family, switches, message):
    raw = {**tiny_config(family).to_dict(), **switches}
    with pytest.raises(UnsupportedModelError, match=message):
        FAMILIES[family].parse_config(raw)


def test_laguna_router_weight_on_the_input_is_refused():
    """LagunaConfig raises on it (transformers does not implement it); a config.json that says
    so anyway is refused in one line."""
    raw = {**tiny_config("laguna").to_dict(), "moe_apply_router_weight_on_input": True}
    with pytest.raises(UnsupportedModelError, match="moe_apply_router_weight_on_input is True"):
        FAMILIES["laguna"].parse_config(raw)


def test_laguna_reads_its_gate_and_routing():
    config = FAMILIES["laguna"].parse_config(tiny_config("laguna").to_dict())
    assert config.attention_gate == AttentionGate(activation="softplus", per_head=True)
    routing = config.moe.group_routing
    assert (routing.logit_softcap, routing.scaling) == (1.5, 2.5)
    assert config.moe.sparse_layers == (1, 2) and config.moe.shared_expert_size == 64
    assert config.rope_of_layer(1).partial_rotary_factor == 0.5
    assert config.rope_of_layer(0).theta == 10000.0 and config.window_of_layer(0) == 5


@pytest.mark.parametrize(
    ("family", "ep"),
    [(family, "cuda") for family in ROWS] + [("mimo_v2_flash", "dml"), ("mimo_v2_flash", "webgpu")],
)
def test_gpu_ep_graphs_attend_with_group_query_attention(family, ep, tmp_path):
    """Every layer's attention fuses to GroupQueryAttention (the sliding ones windowed), but
    MiMo's sliding layers with sinks where the EP's GQA takes no head_sink (dml, webgpu);
    Laguna's output gates stay beside it, one Softplus a layer."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    graph = mobius_genai.build(ckpt, ep, "f16", load_weights=False)["model"].graph
    ops = [node.op_type for node in graph]
    standard = 2 if family == "mimo_v2_flash" and ep != "cuda" else 0
    assert ops.count("GroupQueryAttention") == 3 - standard
    assert ops.count("Attention") == standard
    windows = [
        node.attributes.get_int("local_window_size", -1)
        for node in graph
        if node.op_type == "GroupQueryAttention"
    ]
    assert windows == ([-1, 5, 5][: 3 - standard] if family == "mimo_v2_flash" else [5, -1, 5])
    assert ops.count("Softplus") == (3 if family == "laguna" else 0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ROWS)
def test_bundle_generates_like_transformers(family, tmp_path, capsys):
    """og's greedy tokens equal transformers', alone and in a batch of different lengths."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    check_bundle_generates_like_transformers(ckpt, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("family", ROWS)
def test_int4_bundle_runs_its_experts_as_qmoe(family, tmp_path):
    """--precision int4 on cpu: the sparse layers' experts in QMoE, the projections in
    MatMulNBits, and og generates with it."""
    ops = int4_bundle_ops(family, tmp_path)
    assert ops["QMoE"] == 2 and ops["MoE"] == 0 and ops["MatMulNBits"] > 0


def test_mimo_v2_flash_cache_holds_the_widest_heads(tmp_path):
    """Every layer's cache: the sliding layers' four key/value heads of the key head size 24,
    the full layer's two each repeated, the values padded from 16; sinks only where stored."""
    config = FAMILIES["mimo_v2_flash"].parse_config(tiny_config("mimo_v2_flash").to_dict())
    assert (config.num_key_value_heads, config.head_dim) == (4, 24)
    assert config.head_layout.kv_heads == (2, 4, 4) and config.head_layout.v_head_dim == 16
    assert [config.has_sinks(i) for i in range(3)] == [False, True, True]
    assert config.rope_of_layer(0).partial_rotary_factor == 0.334
    assert config.moe.shared_expert_size == 0 and config.moe.sparse_layers == (1, 2)
