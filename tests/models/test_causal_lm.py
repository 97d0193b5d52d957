"""Portable graph vs transformers: 12-token prefill + 4 cached decode steps, f32, <= 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

import mobius_genai
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference
from tests.conftest import TINY_QWEN2

TOLERANCE = 1e-4  # f32, max abs diff of logits over prefill and every decode step

CASES = {
    "llama": ("llama", {}),
    "llama_attention_bias": ("llama", {"attention_bias": True}),
    "llama3_rope_tied": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            "tie_word_embeddings": True,
        },
    ),
    "llama_linear_rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama_yarn_rope": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "mistral_sliding_window": ("mistral", {"sliding_window": 5}),
    "qwen2_biases": ("qwen2", {}),
    "qwen2_sliding_window": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    ),
    "qwen3_qk_norm_head_dim": ("qwen3", {}),
    "qwen3_tied": ("qwen3", {"tie_word_embeddings": True}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_portable_graph_matches_transformers(case, tmp_path):
    family, overrides = CASES[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    reference = hf_reference_logits(ckpt, ids, decode_steps=4)
    package = mobius_genai.build(ckpt, "default", "f32")
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_hub_layout_checkpoint_matches_transformers(tmp_path):
    ckpt = write_tiny_checkpoint(
        tmp_path / "ckpt",
        "llama",
        hub_layout=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    assert "rope_parameters" not in (ckpt / "config.json").read_text()
    ids = np.random.default_rng(1).integers(3, 128, size=(1, 12))
    reference = hf_reference_logits(ckpt, ids, decode_steps=4)
    ours = run_like_reference(ort_session(mobius_genai.build(ckpt), tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def test_left_padded_batch_matches_transformers(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "qwen2")
    ids = np.random.default_rng(2).integers(3, 128, size=(2, 12))
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    reference = hf_reference_logits(ckpt, ids, decode_steps=4, attention_mask=mask)
    ours = run_like_reference(ort_session(mobius_genai.build(ckpt), tmp_path / "onnx"), reference)
    real = mask.astype(bool)
    assert np.abs(ours[0][real] - reference.logits[0][real]).max() <= TOLERANCE
    assert max_abs_diff(ours[1:], reference.logits[1:]) <= TOLERANCE


def test_committed_tiny_model_matches_transformers(tmp_path):
    ckpt = TINY_QWEN2
    ids = np.random.default_rng(3).integers(0, 381, size=(1, 40))
    reference = hf_reference_logits(ckpt, ids, decode_steps=4)
    ours = run_like_reference(ort_session(mobius_genai.build(ckpt), tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE
