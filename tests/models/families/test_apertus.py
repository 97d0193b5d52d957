"""Apertus vs transformers: the ungated MLP's xIELU activation (components/xielu.py, its learned
alpha_p and alpha_n, its beta and eps buffers read from the checkpoint), per-head q/k norms and
ApertusConfig's llama3 rope.

f32, 2 x 12-token prefill + 4 cached decode steps, <= 1e-4 on the portable, cpu and
onnx-standard graphs; a mutant with xIELU's two alphas swapped fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoConfig

import mobius_genai
from mobius_genai.components import mlp
from mobius_genai.components.xielu import XIELU
from mobius_genai.errors import ConfigError
from tests._hf import edit_config, hf_reference_logits, write_tiny_checkpoint
from tests._ort import case_diffs, graph_diffs, max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")

CASES = {
    "defaults": {},
    "attention_bias_tied": {"attention_bias": True, "tie_word_embeddings": True},
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


@pytest.mark.parametrize("case", sorted(CASES))
def test_apertus_graphs_match_transformers(case, tmp_path):
    diffs = case_diffs(tmp_path, "apertus", _ids(), EPS, seed=1, **CASES[case])
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_hub_layout_and_the_config_class_rope(tmp_path):
    """Apertus-8B's config.json (rope_theta and rope_scaling at the top level) parses as
    transformers' does; a config.json without rope keys gets ApertusConfig's llama3 rope
    (factor 8 from 8192 positions), which the tiny checkpoint's rope is not."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "apertus", seed=1, hub_layout=True)
    assert json.loads((ckpt / "config.json").read_text())["rope_scaling"]["factor"] == 8.0
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs
    data = json.loads((ckpt / "config.json").read_text())
    for key in ("rope_theta", "rope_scaling"):
        data.pop(key)
    (ckpt / "config.json").write_text(json.dumps(data))
    rope = AutoConfig.from_pretrained(ckpt).rope_parameters
    assert rope["original_max_position_embeddings"] == 8192
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path / "class_rope", progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


def test_cpu_graph_runs_group_query_attention_in_every_layer(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "apertus")
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    ops = [node.op_type for node in graph]
    assert ops.count("GroupQueryAttention") == 3 and "Attention" not in ops


class _AlphasSwapped(XIELU):
    """alpha_p read as alpha_n and the other way round."""

    def forward(self, op, x):
        self.alpha_p, self.alpha_n = self.alpha_n, self.alpha_p
        try:
            return super().forward(op, x)
        finally:
            self.alpha_p, self.alpha_n = self.alpha_n, self.alpha_p


def test_parity_fails_with_xielus_alphas_swapped(tmp_path, monkeypatch):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "apertus", seed=1)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=1)
    package = mobius_genai.build(ckpt, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "ours"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE
    monkeypatch.setitem(mlp.LEARNED_ACTIVATIONS, "xielu", _AlphasSwapped)
    package = mobius_genai.build(ckpt, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path / "mutant"), reference)
    assert max_abs_diff(ours, reference.logits) > 10 * TOLERANCE


def test_xielu_in_a_gated_mlp_is_refused(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "llama")
    edit_config(ckpt, hidden_act="xielu")
    with pytest.raises(ConfigError, match="'xielu' is supported in an ungated MLP"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)
