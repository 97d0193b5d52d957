"""Tiny random Gemma 4 checkpoints with an audio tower (E2B/E4B's kind), written by
transformers (no download), the speech graph built from them, and transformers' side of the
comparisons: log-mel features (Gemma4AudioFeatureExtractor) and the audio tokens."""

from __future__ import annotations

import dataclasses
import io
import json
import wave
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch
from safetensors.numpy import load_file
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

from mobius_genai.ep.context import build_context
from mobius_genai.models.vision_language import VISION_LANGUAGE
from mobius_genai.optimize import optimize_model
from mobius_genai.runtime.audio import SAMPLE_RATE, tone_bytes
from mobius_genai.target import resolve_target
from mobius_genai.tasks.vision_language import SpeechTask
from tests._gemma4_vision import TOP, _attach, _config, _tiny, write_gemma4_checkpoint

MEL_BINS = 16  # the first subsampling convolution's channels: the bins its output flattens
#: Chunks of 4 queries over 4 past keys: several chunks in a short clip, lengths that are not
#: multiples of 4; a softcap small enough that logits reach its curve.
AUDIO = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "subsampling_conv_channels": [MEL_BINS, 8],
    "conv_kernel_size": 3,
    "attention_chunk_size": 4,
    "attention_context_left": 5,
    "attention_logit_cap": 2.0,
    "output_proj_dims": 24,
    "use_clipped_linears": True,
}
#: transformers' feature extractor for the tiny tower (its defaults but the mel bins).
FEATURES = {"feature_size": MEL_BINS}


def write_gemma4_audio_checkpoint(folder: Path) -> Gemma4ForConditionalGeneration:
    """`write_gemma4_checkpoint` with the tiny audio tower, and the feature extractor's
    settings where transformers 5 saves a processor's parts (processor_config.json)."""
    model = write_gemma4_checkpoint(folder, audio_config=AUDIO)
    settings = {"feature_extractor_type": "Gemma4AudioFeatureExtractor", **FEATURES}
    (folder / "processor_config.json").write_text(json.dumps({"feature_extractor": settings}))
    return model


def tiny_gemma4_audio(**audio: object) -> Gemma4ForConditionalGeneration:
    """A seeded random Gemma4ForConditionalGeneration with vision and audio towers; `audio`
    overrides audio_config keys."""
    return _tiny({}, TOP, audio={**AUDIO, **audio})


def log_mel(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' (input_features [1, frames, mel], input_features_mask [1, frames]) of
    float samples at 16 kHz (padded to a multiple of 128 samples, the padding masked)."""
    out = Gemma4AudioFeatureExtractor(**FEATURES)([samples], return_tensors="np")
    return out["input_features"].astype(np.float32), out["input_features_mask"]


def random_features(frames: int, valid: int | None = None, seed: int = 0):
    """Random log-mel-like features [1, frames, mel] and a mask with `valid` real frames."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(1, frames, MEL_BINS)).astype(np.float32)
    mask = np.zeros((1, frames), bool)
    mask[0, : frames if valid is None else valid] = True
    return features * mask[..., None], mask


def reference_audio_features(model, features: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' audio soft tokens [tokens, text hidden]: the tower, the embedder, the
    padding tokens dropped (Gemma4Model.forward)."""
    with torch.no_grad():
        out = model.model.get_audio_features(
            torch.from_numpy(features), torch.from_numpy(mask), return_dict=True
        )
        return out.pooler_output[out.attention_mask].numpy()


def speech_graph(model, folder: Path, ep: str = "default", **audio_changes: object) -> ir.Model:
    """The speech graph of the checkpoint saved in `folder`, fp32, optimized for `ep`;
    `audio_changes` replace fields of the audio config (a mutant's)."""
    config = _config(model)
    if audio_changes:
        config = dataclasses.replace(
            config, audio=dataclasses.replace(config.audio, **audio_changes)
        )
    target = resolve_target(ep, dtype="fp32")
    with build_context(target.ep, target.dtype):
        graph = SpeechTask().build(
            VISION_LANGUAGE["gemma4"].audio_model(config), config.embedding_width
        )
    _attach(graph, load_file(folder / "model.safetensors"), target.dtype)
    optimize_model(graph, ep=target.ep, dtype=target.dtype, model_role="vision")
    return graph


def tone_wav(samples: int) -> bytes:
    """A mono 16-bit WAV of a 440 Hz tone `samples` long (at 16 kHz)."""
    return tone_bytes(samples / SAMPLE_RATE)


def wav_samples(data: bytes) -> np.ndarray:
    """A 16-bit WAV's samples as floats in [-1, 1) (og's AudioDecoder's scaling)."""
    with wave.open(io.BytesIO(data)) as clip:
        pcm = np.frombuffer(clip.readframes(clip.getnframes()), np.int16)
    return pcm.astype(np.float32) / 32768
