"""Model types transformers runs with another family's classes under a config class of their
own (models/families/alias_rows.py), vs transformers.

Parity: f32, 2 x 12-token prefill + 4 cached decode steps, portable and cpu graphs, <= 1e-4,
on each row's tiny checkpoint (tests/_hf.py; slow); by default prefill and one decode step on
the portable graph with a hub-like config.json that leaves to the config class the keys whose
defaults differ from the parent's. Mutants: the row with its parent's
defaults reads such a config.json wrongly (the logits move, or the weights do not fit).
Defaults: test_defaults.py; og's greedy tokens: test_bundles.py (slow).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import mobius_genai
from mobius_genai.errors import UnsupportedModelError, WeightsError
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.alias_rows import ALIASES
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import graph_diffs, mutant_diffs

TOLERANCE = 1e-4
EPS = ("default", "cpu")
_PARENTS = {alias.model_type: alias.parent for alias in ALIASES}

#: model_type → the config.json keys (a rope_parameters key as "rope_parameters.KEY") left
#: to the config class: defaults that differ from the parent row's and move the logits
#: (iquestcoder's eps, GLM-4 MoE's half rotary) or the weights' shapes (DeepSeek-V3's q_a_proj).
_LEFT_OUT = {
    "iquestcoder": ("rms_norm_eps",),
    "param2moe": ("rope_parameters.partial_rotary_factor", "rms_norm_eps"),
    "sarvam_moe": ("rope_parameters.partial_rotary_factor", "rms_norm_eps"),
    "sarvam_mla": ("q_lora_rank",),
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


def _hub_like(folder, model_type: str) -> None:
    """Drop `_LEFT_OUT`'s keys from the checkpoint's config.json."""
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    for key in _LEFT_OUT[model_type]:
        section, _, inner = key.rpartition(".")
        (raw[section] if section else raw).pop(inner, None)
    path.write_text(json.dumps(raw))


#: Slow: each row's default-run parity is the portable graph's in the test of its config keys
#: below (apertus1p5_text: apertus's parity with another vocabulary; the MoE rows' run in
#: test_moe.py's CASES too)
@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(_PARENTS))
def test_alias_graphs_match_transformers(model_type, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", model_type, seed=1)
    diffs = graph_diffs(
        ckpt, hf_reference_logits(ckpt, _ids(), decode_steps=4), EPS, tmp_path, progress=False
    )
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.parametrize(
    "model_type",
    # sarvam_moe is param2moe's row with other numbers
    [
        pytest.param(m, marks=[pytest.mark.slow] if m == "sarvam_moe" else [])
        for m in sorted(_LEFT_OUT)
    ],
)
def test_keys_left_to_the_config_class_are_read_with_its_defaults(
    model_type, tmp_path, monkeypatch
):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", model_type, seed=1)
    _hub_like(ckpt, model_type)
    ids = _ids()[:1]
    row = FAMILIES[model_type]
    mutant = dataclasses.replace(
        row, config_defaults=FAMILIES[_PARENTS[model_type]].config_defaults
    )
    if model_type == "sarvam_mla":  # DeepSeek-V3's default q_lora_rank: a q_a_proj
        diffs = graph_diffs(
            ckpt, hf_reference_logits(ckpt, ids, decode_steps=1), ("default",), tmp_path
        )
        assert max(diffs.values()) <= TOLERANCE, diffs
        monkeypatch.setitem(FAMILIES, model_type, mutant)
        with pytest.raises(WeightsError, match="q_a_proj"):
            mobius_genai.build(ckpt, "default", "f32", load_weights=True)
        return
    ours, wrong = mutant_diffs(ckpt, ids, tmp_path, model_type, mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert wrong > 10 * TOLERANCE


def test_sarvam_mla_reads_deepseek_yarn_as_yarn(tmp_path):
    """Sarvam-105B's hub config: rope_scaling of type deepseek_yarn, no rope_parameters, a
    legacy head_dim (kv_lora_rank + qk_rope_head_dim); SarvamMLAConfig reads yarn."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "sarvam_mla", seed=1)
    path = ckpt / "config.json"
    raw = json.loads(path.read_text())
    rope = raw.pop("rope_parameters")
    raw["rope_theta"] = rope.pop("rope_theta")
    raw["rope_scaling"] = {**{k: v for k, v in rope.items() if k != "rope_type"}}
    raw["rope_scaling"]["type"] = "deepseek_yarn"
    raw["head_dim"] = raw["kv_lora_rank"] + raw["qk_rope_head_dim"]
    path.write_text(json.dumps(raw))
    assert FAMILIES["sarvam_mla"].parse_config(raw).rope.type == "yarn"
    ids = _ids()[:1]
    diffs = graph_diffs(
        ckpt, hf_reference_logits(ckpt, ids, decode_steps=4), ("default",), tmp_path, progress=False
    )
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_apertus1p5_text_pruned_head_is_refused(tmp_path):
    """Released Apertus 1.5 checkpoints prune the LM head to the text ids; a full-width
    output_vocab_size is the unpruned head transformers also reads as null."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "apertus1p5_text")
    raw = json.loads((ckpt / "config.json").read_text())
    row = FAMILIES["apertus1p5_text"]
    assert row.parse_config({**raw, "output_vocab_size": 128}).vocab_size == 128
    with pytest.raises(UnsupportedModelError, match="output_vocab_size is 100; apertus1p5_text"):
        row.parse_config({**raw, "output_vocab_size": 100})
