"""DBRX beyond the parity cases and mutants of test_parity.py: its nested config sections as
transformers fills them, the hub layout's rope base, the flat experts read an expert at a time
(their block order a mutant), and its int4 bundle's QMoE experts generating in
onnxruntime-genai."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from transformers import DbrxConfig

import mobius_genai
from mobius_genai.checkpoint import experts
from mobius_genai.checkpoint.weights import Checkpoint
from mobius_genai.errors import ConfigError, WeightsError
from mobius_genai.models import FAMILIES
from tests._bundles import bundle_checkpoint, int4_bundle_ops
from tests._hf import tiny_config, write_tiny_checkpoint
from tests._ort import mutant_diffs
from tests.models.families.test_parity import TOLERANCE

ROW = FAMILIES["dbrx"]
_SECTIONS = ("attn_config", "ffn_config")
#: The keys of each section DbrxConfig's sub-configs read (their other keys are bookkeeping).
_READ = {
    "attn_config": ("clip_qkv", "kv_n_heads", "rope_theta"),
    "ffn_config": (
        "ffn_act_fn",
        "ffn_hidden_size",
        "moe_num_experts",
        "moe_top_k",
        "moe_normalize_expert_weights",
    ),
}


def _config_json() -> dict:
    raw = tiny_config("dbrx").to_dict()
    return {**raw, **{name: {k: raw[name][k] for k in _READ[name]} for name in _SECTIONS}}


@pytest.mark.parametrize(("section", "key"), [(s, k) for s in _SECTIONS for k in _READ[s]])
def test_a_section_key_left_out_reads_as_transformers_fills_it(section, key):
    """Each nested key dropped in turn: our row's config equals its parse of the config.json
    DbrxConfig writes back with the sub-config's default filled in (attn_config's rope_theta
    only where rope_parameters does not give the base, as in a hub config.json)."""
    raw = _config_json()
    if key == "rope_theta":
        raw.pop("rope_parameters")
    raw[section] = {k: v for k, v in raw[section].items() if k != key}
    filled = DbrxConfig.from_dict(dict(raw)).to_dict()
    if key == "rope_theta":  # transformers 5 rotates by rope_parameters alone (below)
        filled.pop("rope_parameters")
        filled["attn_config"].pop("rope_theta", None)
    assert ROW.parse_config(raw) == ROW.parse_config(filled)


def test_hub_layout_rotates_by_attn_config_rope_theta():
    """dbrx-instruct's config.json (transformers 4) gives the base as attn_config.rope_theta
    alone, which DBRX was trained with and transformers 4 rotated by; transformers 5.25 reads
    only rope_parameters and rotates such a checkpoint by 10000. A rope_parameters base (what
    transformers 5 writes) comes first."""
    raw = _config_json()
    raw.pop("rope_parameters")
    raw["attn_config"]["rope_theta"] = 500_000
    assert ROW.parse_config(raw).rope.theta == 500_000.0
    with_parameters = {**raw, "rope_parameters": {"rope_type": "default", "rope_theta": 20_000.0}}
    assert ROW.parse_config(with_parameters).rope.theta == 20_000.0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"ffn_config": [4, 2]}, "ffn_config"),
        ({"ffn_config": {"moe_normalize_expert_weights": 0}}, "moe_normalize_expert_weights"),
        ({"attn_config": {"clip_qkv": -1}}, "attn_config.clip_qkv"),
        ({"ffn_config": {"ffn_act_fn": {"name": "gelu"}}}, "hidden_act 'gelu'"),
    ],
)
def test_bad_sections_are_one_line_config_errors(change, named):
    raw = {**_config_json(), **change}
    with pytest.raises(ConfigError, match=named) as error:
        ROW.parse_config(raw)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_flat_experts_are_read_one_expert_block_at_a_time(precision, tmp_path, monkeypatch):
    """Packaging reads w1, v1 and w2 a block of ffn_hidden_size rows at a time, each block
    once: a layer's float experts are never stacked whole, and int4 quantizes each expert
    once for its codes, scales and zero points."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "dbrx")
    reads: Counter = Counter()
    original = Checkpoint.read

    def counted(self, name, index=None):
        if name.endswith((".w1", ".v1", ".w2")):
            rows = index[0] if index else slice(0, None)
            reads[(name, rows.start, rows.stop)] += 1
        return original(self, name, index)

    def refuse(self):
        raise AssertionError(f"{self.name}: every expert of a layer materialized at once")

    monkeypatch.setattr(Checkpoint, "read", counted)
    monkeypatch.setattr(experts.ExpertsTensor, "_load", refuse)
    mobius_genai.package(ckpt, "cpu", tmp_path / "bundle", precision=precision, quiet=True)
    ffn = tiny_config("dbrx").ffn_config
    blocks = {(e * ffn.ffn_hidden_size, (e + 1) * ffn.ffn_hidden_size) for e in range(4)}
    assert {(start, stop) for _, start, stop in reads} == blocks
    assert len(reads) == 3 * 3 * ffn.moe_num_experts  # 3 layers of w1, v1, w2
    assert set(reads.values()) == {1}


def test_parity_fails_with_the_expert_blocks_in_reverse(tmp_path, monkeypatch):
    """Expert e read from block E - 1 - e of the flat tensors (a mutant of the split)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "dbrx", seed=1)
    original = experts._Reader.read

    def reversed_blocks(self, template, expert):
        return original(self, template, tiny_config("dbrx").ffn_config.moe_num_experts - 1 - expert)

    ids = np.random.default_rng(0).integers(3, 128, size=(1, 12))
    mutant = (experts._Reader, "read", reversed_blocks)
    ours, mutated = mutant_diffs(ckpt, ids, tmp_path, "dbrx", mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


def test_cpu_int4_bundle_runs_its_experts_as_qmoe(tmp_path):
    """int4 for cpu: each layer's experts in one QMoE node (the p-norm factor in standard ops
    beside it), and onnxruntime-genai generates every token asked for."""
    ops = int4_bundle_ops("dbrx", tmp_path)
    assert (ops["QMoE"], ops["MoE"]) == (3, 0)
    assert ops["MatMulNBits"] > 0
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["ffn_config"]["moe_normalize_expert_weights"] == 2.0


def test_flat_experts_of_another_size_are_refused_naming_the_tensor(tmp_path):
    """A config.json whose ffn_hidden_size does not split w1's rows: one WeightsError naming
    the tensor, its shape and the shape config.json needs, before anything is built."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "dbrx", seed=1)
    raw = json.loads((ckpt / "config.json").read_text())
    raw["ffn_config"]["ffn_hidden_size"] = 16
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(WeightsError, match=r"ffn\.experts\.mlp\.w1'.* \[128, 64\].*\[64, 64\]"):
        mobius_genai.build(ckpt, "default", "f32", progress=False)
