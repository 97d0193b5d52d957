"""Cohere2-MoE beyond the parity cases and mutants of test_parity.py: the layer lists a
config.json without them gets from first_k_dense_replace, as transformers derives them; its
bad switches; its int4 bundle's QMoE experts generating in onnxruntime-genai."""

from __future__ import annotations

import pytest
from transformers import Cohere2MoeConfig

from mobius_genai.errors import ConfigError
from mobius_genai.models import FAMILIES
from tests._bundles import int4_bundle_ops
from tests._hf import tiny_config

ROW = FAMILIES["cohere2_moe"]


def _config_json(**changes) -> dict:
    raw = tiny_config("cohere2_moe").to_dict()
    return {**raw, **changes}


@pytest.mark.parametrize("prefix_pattern", [1, 2])
@pytest.mark.parametrize("dense", [0, 1, 2])
def test_layer_lists_follow_first_k_dense_replace_as_transformers_derives_them(
    dense, prefix_pattern
):
    """Without layer_types and mlp_layer_types, Cohere2MoeConfig derives both from its
    first_k_dense_replace argument and the two window patterns; our row reads the same
    layers, windows, rotary layers and experts."""
    raw = _config_json(
        first_k_dense_replace=dense, prefix_dense_sliding_window_pattern=prefix_pattern
    )
    for key in ("layer_types", "mlp_layer_types"):
        raw.pop(key)
    filled = Cohere2MoeConfig.from_dict(dict(raw)).to_dict()
    ours, theirs = ROW.parse_config(raw), ROW.parse_config(filled)
    assert ours == theirs
    assert ours.moe.sparse_layers == tuple(range(dense, 3))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"expert_selection_fn": "relu"}, "expert_selection_fn"),
        ({"shared_expert_combination_strategy": "max"}, "shared_expert_combination_strategy"),
        ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
        ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
    ],
)
def test_bad_switches_are_one_line_config_errors(change, named):
    with pytest.raises(ConfigError, match=named) as error:
        ROW.parse_config(_config_json(**change))
    assert "\n" not in str(error.value)


def test_cpu_int4_bundle_runs_its_experts_as_qmoe(tmp_path):
    """int4 for cpu: the two MoE layers' experts in QMoE (the dense layer and the shared
    expert in MatMulNBits), and onnxruntime-genai generates every token asked for."""
    ops = int4_bundle_ops("cohere2_moe", tmp_path)
    assert (ops["QMoE"], ops["MoE"]) == (2, 0)
    assert ops["MatMulNBits"] > 0
