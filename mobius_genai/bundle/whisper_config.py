"""genai_config.json and audio_processor_config.json of a Whisper bundle (og's `whisper` type).

onnxruntime-genai 0.18 reads `model.encoder` (the audio_features input, the hidden_states and
cross-cache outputs) and `model.decoder` (input_ids, the self and cross cache names) and runs
the encoder once per generator; its WhisperProcessor turns audio into the encoder's
audio_features with the onnxruntime-extensions pipeline `audio_processor_config.json` names
(the file name og looks for). docs/whisper.md has the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.bundle.genai_config import check_token_ids, provider_options, search_defaults
from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.errors import ConfigError
from mobius_genai.kinds.og_types import AUDIO_PROCESSOR_FILE
from mobius_genai.tasks import whisper as io

AUDIO_PROCESSOR_CONFIG = AUDIO_PROCESSOR_FILE
#: Whisper's front end (openai/whisper's audio.py): 16 kHz audio, 25 ms windows every 10 ms.
SAMPLE_RATE, N_FFT, HOP_LENGTH = 16_000, 400, 160
_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def _session_options(ep: EpCapabilities) -> dict[str, Any]:
    # No GroupQueryAttention (og feeds no attention_mask), so no shared past/present buffer.
    return {"provider_options": provider_options(ep, share_buffer=False)}


def _sizes(config: WhisperConfig, heads: int, layers: int, filename: str) -> dict[str, Any]:
    """The keys og reads to size a graph's caches and heads."""
    return {
        "filename": filename,
        "head_size": config.d_model // heads,
        "hidden_size": config.d_model,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "num_hidden_layers": layers,
    }


def encoder_section(config: WhisperConfig, ep: EpCapabilities, filename: str) -> dict[str, Any]:
    """`model.encoder`: the encoder graph `filename` and its names."""
    return {
        **_sizes(config, config.encoder_attention_heads, config.encoder_layers, filename),
        "inputs": {"audio_features": io.AUDIO_FEATURES},
        "outputs": {
            "encoder_hidden_states": io.HIDDEN_STATES,
            "cross_present_key_names": io.PRESENT_KEY_CROSS,
            "cross_present_value_names": io.PRESENT_VALUE_CROSS,
        },
        "session_options": _session_options(ep),
    }


def decoder_section(config: WhisperConfig, ep: EpCapabilities, filename: str) -> dict[str, Any]:
    """`model.decoder`: the decoder graph `filename` and its self and cross cache names."""
    return {
        **_sizes(config, config.decoder_attention_heads, config.decoder_layers, filename),
        "inputs": {
            "input_ids": io.INPUT_IDS,
            "past_key_names": io.PAST_KEY_SELF,
            "past_value_names": io.PAST_VALUE_SELF,
            "cross_past_key_names": io.PAST_KEY_CROSS,
            "cross_past_value_names": io.PAST_VALUE_CROSS,
        },
        "outputs": {
            "logits": io.LOGITS,
            "present_key_names": io.PRESENT_KEY_SELF,
            "present_value_names": io.PRESENT_VALUE_SELF,
        },
        "session_options": _session_options(ep),
    }


def whisper_token_ids(config: WhisperConfig, generation: Mapping[str, Any]) -> dict[str, int]:
    """bos / eos / pad / decoder_start ids: generation_config.json first, then config.json;
    each must be a row of the logits."""
    ids = {}
    for key in _TOKEN_KEYS:
        value = generation.get(key, getattr(config, key))
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"generation_config.json: {key} must be an integer token id, found {value!r}"
            )
        ids[key] = value
    problems = check_token_ids(
        ((f"generation_config.json/config.json: {key}", value) for key, value in ids.items()),
        config.vocab_size,
        "config.json's vocab_size",
    )
    if problems:
        raise ConfigError("; ".join(problems))
    return ids


def whisper_genai_config(
    config: WhisperConfig,
    ep: EpCapabilities,
    *,
    generation: Mapping[str, Any] | None = None,
    encoder_filename: str = "encoder.onnx",
    decoder_filename: str = "decoder.onnx",
) -> dict[str, Any]:
    """The genai_config.json document of a Whisper bundle on `ep`; `generation` is
    generation_config.json (token ids and search settings)."""
    generation = generation or {}
    model = {
        "type": "whisper",
        "context_length": config.max_target_positions,
        "vocab_size": config.vocab_size,
        **whisper_token_ids(config, generation),
        "encoder": encoder_section(config, ep, encoder_filename),
        "decoder": decoder_section(config, ep, decoder_filename),
    }
    search = {
        **search_defaults(generation),
        "max_length": config.max_target_positions,
        "past_present_share_buffer": False,
    }
    return {"model": model, "search": search}


def audio_processor_config(config: WhisperConfig) -> dict[str, Any]:
    """audio_processor_config.json: decode the audio (resampled to 16 kHz), STFT, log-mel with
    the config's mel bins, padded or cut to the encoder's mel_frames (`chunk_size` seconds)."""
    seconds, rest = divmod(config.mel_frames * HOP_LENGTH, SAMPLE_RATE)
    if rest:
        raise ConfigError(
            f"config.json: max_source_positions {config.max_source_positions} makes "
            f"{config.mel_frames} mel frames, not whole seconds of audio; accepted: a multiple "
            f"of {SAMPLE_RATE // HOP_LENGTH // 2} (1500 in every released Whisper)"
        )
    stft = {"n_fft": N_FFT, "frame_length": N_FFT, "hop_length": HOP_LENGTH}
    mel = {
        "chunk_size": seconds,
        "hop_length": HOP_LENGTH,
        "n_fft": N_FFT,
        "n_mel": config.num_mel_bins,
    }
    return {
        "feature_extraction": {
            "sequence": [
                {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
                {"operation": {"name": "STFT", "type": "STFTNorm", "attrs": stft}},
                {
                    "operation": {
                        "name": "log_mel_spectrogram",
                        "type": "LogMelSpectrum",
                        "attrs": mel,
                    }
                },
            ]
        }
    }
