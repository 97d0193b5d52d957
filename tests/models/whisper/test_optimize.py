"""Whisper graphs through the EP pipeline with roles "encoder" and "decoder": the ops each EP
gets, and the optimized graphs still match transformers (f32, onnxruntime CPU)."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnx_ir as ir
import pytest

from mobius_genai.ep.context import build_context
from mobius_genai.models.whisper import WHISPER_ROLES, whisper_graphs
from mobius_genai.optimize.pipeline import optimize_model
from tests._ort import max_abs_diff
from tests.models.whisper._whisper import (
    PROMPT,
    STEPS,
    build_sessions,
    hf_decoder_logits,
    mel_features,
    read_config,
    run_decoder,
    run_encoder,
)


def _optimized_ops(folder, ep: str) -> dict[str, Counter]:
    with build_context(ep, ir.DataType.FLOAT):
        models = whisper_graphs(read_config(folder), None)
    ops = {}
    for key, model in models.items():
        optimize_model(model, ep, ir.DataType.FLOAT, WHISPER_ROLES[key])
        ops[key] = Counter((node.domain or "", node.op_type) for node in model.graph.all_nodes())
    return ops


def test_onnx_standard_has_no_custom_domain_op(multilingual_checkpoint):
    _, folder = multilingual_checkpoint
    for key, ops in _optimized_ops(folder, "onnx-standard").items():
        assert {domain for domain, _ in ops} <= {"", "ai.onnx"}, (key, ops)
        assert ops[("", "Attention")] == {"encoder": 2, "decoder": 4}[key]
        assert ops[("", "Conv")] == {"encoder": 2, "decoder": 0}[key]


def test_cpu_fuses_norms_and_gelu_but_no_gqa(multilingual_checkpoint):
    _, folder = multilingual_checkpoint
    ops = _optimized_ops(folder, "cpu")
    for key in ("encoder", "decoder"):
        assert ops[key][("com.microsoft", "SkipLayerNormalization")] > 0, key
        assert ops[key][("com.microsoft", "BiasGelu")] == 2, key
        assert ops[key][("com.microsoft", "GroupQueryAttention")] == 0, key
    # the encoder's two self-attentions; the decoder's self- and cross-attention per layer
    assert ops["encoder"][("", "Attention")] == 2
    assert ops["decoder"][("", "Attention")] == 4


@pytest.mark.parametrize("ep", ["cpu", "webgpu", "cuda"])
def test_the_decoder_role_gates_gqa_off_without_a_warning(multilingual_checkpoint, ep):
    """Whisper's decoder has the role "cross_decoder": GQAFusion's gate declines it (og feeds
    it no attention_mask), so the pipeline expects no GQA and says nothing."""
    _, folder = multilingual_checkpoint
    assert WHISPER_ROLES["decoder"] == "cross_decoder"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops = _optimized_ops(folder, ep)
    assert ops["decoder"][("com.microsoft", "GroupQueryAttention")] == 0


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard", "webgpu"])
def test_optimized_graphs_match_transformers(multilingual_checkpoint, tmp_path, ep):
    model, folder = multilingual_checkpoint
    sessions = build_sessions(folder, tmp_path, ep, optimize=True)
    mel = mel_features(model.config.num_mel_bins)
    calls = [PROMPT, *STEPS]
    ours = run_decoder(sessions["decoder"], run_encoder(sessions["encoder"], mel), calls)
    assert max_abs_diff(ours, hf_decoder_logits(model, mel, calls)) < 1e-4


@pytest.mark.parametrize("ep", ["cuda", "onnx-standard"])
def test_float16_graphs_stay_close_to_transformers(multilingual_checkpoint, tmp_path, ep):
    """f16 (cuda's default dtype) optimized for `ep`, run on onnxruntime's CPU EP: within 3e-2
    of transformers' f32 logits (which reach about 10), measured 8.5e-3."""
    model, folder = multilingual_checkpoint
    sessions = build_sessions(folder, tmp_path, ep, optimize=True, dtype=ir.DataType.FLOAT16)
    mel = mel_features(model.config.num_mel_bins)
    calls = [PROMPT, *STEPS]
    encoded = run_encoder(sessions["encoder"], mel.astype(np.float16))
    assert encoded["hidden_states"].dtype == np.float16
    ours = run_decoder(sessions["decoder"], encoded, calls)
    assert max_abs_diff(ours, hf_decoder_logits(model, mel, calls)) < 3e-2
