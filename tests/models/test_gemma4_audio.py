"""Gemma 4's audio tower and embedder (the speech graph) against transformers' Gemma4AudioModel
and embed_audio (fp32, 1e-4), on clips of several lengths, lengths that are not a multiple of
the attention chunk, padded frames and two clips in one run; a mutant per mechanism of the
tower fails."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from mobius_genai.components import gemma4_audio
from mobius_genai.config.gemma4_audio import Gemma4AudioConfig
from mobius_genai.errors import ConfigError
from mobius_genai.models.vision_language import VISION_LANGUAGE
from tests._gemma4_audio import (
    AUDIO,
    random_features,
    reference_audio_features,
    speech_graph,
    tiny_gemma4_audio,
)
from tests._gemma4_vision import TEXT_HIDDEN, sessions, tiny_gemma4

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
#: (frames, real frames): 37 frames make 10 tokens (2.5 chunks of 4), 40 make 10, 8 make 2
#: (less than one chunk), 101 with the last 11 padded make 23 real tokens of 26.
CLIPS = ((37, None), (40, None), (8, None), (101, 90), (53, 41))


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    model = tiny_gemma4_audio()
    folder = tmp_path_factory.mktemp("gemma4-audio")
    model.save_pretrained(folder)
    return model, folder


def _session(graph: ir.Model) -> ort.InferenceSession:
    return sessions({"speech": graph})["speech"]


@pytest.fixture(scope="module", params=EPS)
def speech(request, gemma4):
    return _session(speech_graph(*gemma4, request.param))


def _run(session, features, mask) -> np.ndarray:
    return session.run(None, {"input_features": features, "input_features_mask": mask})[0]


@pytest.mark.parametrize(("frames", "real"), CLIPS)
def test_speech_graph_matches_transformers(gemma4, speech, frames, real):
    model, _ = gemma4
    features, mask = random_features(frames, real, seed=frames)
    ours = _run(speech, features, mask)
    expected = reference_audio_features(model, features, mask)
    tokens = math.ceil(math.ceil((real or frames) / 2) / 2)  # two stride-2 convolutions
    assert ours.shape == expected.shape == (tokens, TEXT_HIDDEN)
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)


def test_padded_frames_change_nothing_and_two_clips_run_together(gemma4, speech):
    """Frames past the mask (whatever their values) leave the real tokens as they are, and
    two clips of different lengths in one run give each clip's tokens in order."""
    model, _ = gemma4
    features, mask = random_features(64, 45, seed=3)
    noisy = features + (~mask[..., None]) * np.float32(5)  # padding that is not silence
    alone = _run(speech, *random_features(45, seed=3)[:1], np.ones((1, 45), bool))
    np.testing.assert_allclose(_run(speech, noisy, mask), alone, atol=TOLERANCE, rtol=0)
    other, other_mask = random_features(64, seed=4)
    both = np.concatenate([noisy, other]), np.concatenate([mask, other_mask])
    expected = reference_audio_features(model, *both)
    np.testing.assert_allclose(_run(speech, *both), expected, atol=TOLERANCE, rtol=0)


def _mutant_error(gemma4, monkeypatch, **changes) -> float:
    model, folder = gemma4
    features, mask = random_features(64, 57, seed=5)
    features = features + (~mask[..., None]) * np.float32(5)
    ours = _run(_session(speech_graph(model, folder, **changes)), features, mask)
    expected = reference_audio_features(model, features, mask)
    return float(np.abs(ours - expected).max()) if ours.shape == expected.shape else np.inf


MUTANTS = {
    # the key window of each chunk one frame shorter
    "chunk context": ({"attention_context_left": AUDIO["attention_context_left"] - 1}, None),
    # logits no longer softcapped
    "softcap": ({"attention_logit_cap": 1e6}, None),
    # q · rel without Transformer-XL's shift: each row reads the distances unshifted
    "rel-shift": (
        {},
        (
            "rel_shift",
            lambda op, scores, chunk, context, length: op.Pad(
                scores, op.Constant(value_ints=[0] * 9 + [context - length])
            ),
        ),
    ),
    # queries scaled by per_dim_scale itself, not its softplus
    "per_dim_scale": ({}, ("query_scale", lambda op, scale: scale)),
    # the subsampling convolutions see the padded frames
    "subsample mask": ({}, ("masked_frames", lambda op, x, mask: x)),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_a_mutant_per_mechanism_fails(gemma4, monkeypatch, name):
    changes, patch = MUTANTS[name]
    assert _mutant_error(gemma4, monkeypatch) < TOLERANCE  # the unmutated graph passes
    if patch is not None:
        monkeypatch.setattr(gemma4_audio, *patch)
    assert _mutant_error(gemma4, monkeypatch, **changes) > 100 * TOLERANCE


def test_checkpoints_without_audio_build_no_speech_graph():
    """26B and 31B have no audio_config: no audio tower, no audio input to the embedding."""
    raw = tiny_gemma4().config.to_dict()
    assert VISION_LANGUAGE["gemma4"].parse_config(raw).audio is None
    config = VISION_LANGUAGE["gemma4"].parse_config(tiny_gemma4_audio().config.to_dict())
    audio = config.audio
    assert (audio.hidden_size, audio.attention_chunk_size, audio.output_proj_dims) == (32, 4, 24)
    assert audio.subsampling_conv_channels == (16, 8)
    assert audio.context_size == 4 + 4  # the chunk and its 4 past keys


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"subsampling_conv_channels": [18, 8]}, "subsampling_conv_channels"),
        ({"subsampling_conv_channels": [16]}, "subsampling_conv_channels"),
        ({"hidden_size": 30}, "num_attention_heads"),
        ({"hidden_act": "swish_of_swish"}, "hidden_act"),
    ],
)
def test_bad_audio_configs_say_what_is_accepted(changes, words):
    text = VISION_LANGUAGE["gemma4"].parse_config(tiny_gemma4().config.to_dict()).text
    with pytest.raises(ConfigError, match=words):
        Gemma4AudioConfig.from_dict({**AUDIO, **changes}, text)
