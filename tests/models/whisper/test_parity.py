"""Whisper graphs against transformers' WhisperForConditionalGeneration (f32, onnxruntime CPU):
encoder output, cross caches and decoder logits (prefill, then cached steps) within 1e-4, for
the multilingual, English-only and large-v3 layouts; mutants of the cross cache and of the
positions fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mobius_genai.components import whisper as components
from tests._ort import max_abs_diff
from tests.models.whisper._whisper import (
    PROMPT,
    STEPS,
    build_sessions,
    hf_decoder_logits,
    mel_features,
    run_decoder,
    run_encoder,
)

TOLERANCE = 1e-4
CALLS = [PROMPT, *STEPS]


def _cross_reference(model, hidden: np.ndarray, layer: int, proj: str) -> np.ndarray:
    """transformers' k_proj / v_proj of decoder layer `layer` over the encoder output, in heads."""
    attention = model.model.decoder.layers[layer].encoder_attn
    with torch.no_grad():
        projected = getattr(attention, proj)(torch.from_numpy(hidden)).numpy()
    batch, positions, _ = projected.shape
    heads = model.config.decoder_attention_heads
    return projected.reshape(batch, positions, heads, -1).transpose(0, 2, 1, 3)


@pytest.fixture(scope="module")
def sessions(whisper_checkpoint, tmp_path_factory):
    """Our graphs of each layout's checkpoint, opened in onnxruntime."""
    layout, _, folder = whisper_checkpoint
    return build_sessions(folder, tmp_path_factory.mktemp(f"graphs-{layout}"))


def test_encoder_and_cross_cache_match_transformers(whisper_checkpoint, sessions):
    layout, model, _ = whisper_checkpoint
    mel = mel_features(model.config.num_mel_bins)
    encoded = run_encoder(sessions["encoder"], mel)
    with torch.no_grad():
        hidden = model.model.encoder(torch.from_numpy(mel)).last_hidden_state.numpy()
    assert encoded["hidden_states"].shape == (2, 1500, 64)
    assert np.abs(encoded["hidden_states"] - hidden).max() < TOLERANCE, layout
    for layer in range(model.config.decoder_layers):
        for kind, proj in (("key", "k_proj"), ("value", "v_proj")):
            expected = _cross_reference(model, hidden, layer, proj)
            ours = encoded[f"present_{kind}_cross_{layer}"]
            assert np.abs(ours - expected).max() < TOLERANCE, (layout, layer, kind)


def test_decoder_logits_match_transformers_with_cache(whisper_checkpoint, sessions):
    layout, model, _ = whisper_checkpoint
    mel = mel_features(model.config.num_mel_bins)
    ours = run_decoder(sessions["decoder"], run_encoder(sessions["encoder"], mel), CALLS)
    reference = hf_decoder_logits(model, mel, CALLS)
    assert ours[0].shape == (2, len(PROMPT[0]), model.config.vocab_size)
    assert max_abs_diff(ours, reference) < TOLERANCE, layout
    assert max(float(np.abs(r).max()) for r in reference) > 1.0  # logits worth comparing


def _rotated(self, op, encoder_output):
    """Mutant: each decoder layer reads the next layer's cross cache."""
    pairs = [layer(op, encoder_output) for layer in self.layers]
    return pairs[1:] + pairs[:1]


def _shifted(op, table, past_length, end):
    """Mutant: positions one past where they should start."""
    one = op.Constant(value_ints=[1])
    return op.Slice(table, op.Add(past_length, one), op.Add(end, one), op.Constant(value_ints=[0]))


@pytest.mark.parametrize(
    ("target", "name", "mutant"),
    [
        (components._CrossProjections, "forward", _rotated),
        (components, "learned_positions", _shifted),
    ],
    ids=["cross-cache-of-another-layer", "positions-off-by-one"],
)
def test_mutants_fail_parity(multilingual_checkpoint, tmp_path, monkeypatch, target, name, mutant):
    model, folder = multilingual_checkpoint
    monkeypatch.setattr(target, name, mutant)
    sessions = build_sessions(folder, tmp_path)
    mel = mel_features(model.config.num_mel_bins)
    ours = run_decoder(sessions["decoder"], run_encoder(sessions["encoder"], mel), CALLS)
    assert max_abs_diff(ours, hf_decoder_logits(model, mel, CALLS)) > 100 * TOLERANCE
