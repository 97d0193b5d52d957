"""A speech tower's feature extractor as onnxruntime-extensions' audio pipeline: a fact of a
vision-language row with an audio tower (`VisionLanguageFamily.audio_processor`).

og's multimodal processor reads `audio_processor_config.json` ({"feature_extraction":
{"sequence": [...]}}): the clip decoded (AudioDecoder: 16-bit PCM as floats in [-1, 1),
resampled to 16 kHz), then the tower's features. Gemma 4's are og's Gemma4LogMel, which takes
transformers' Gemma4AudioFeatureExtractor settings by their names (checked equal on the same
samples: tests/models/test_gemma4_audio_bundle.py); og pads no clip, so each clip's frames are
all real, the frames transformers keeps unmasked.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json_object
from mobius_genai.errors import ConfigError

#: Gemma4AudioFeatureExtractor settings og's Gemma4LogMel takes (booleans as 0 / 1): the
#: others are derived from these (frame_length, hop_length, fft_length: transformers recomputes
#: them from the milliseconds when it loads the file) or only shape a padded batch.
_GEMMA4_LOG_MEL_KEYS = (
    "feature_size",
    "sampling_rate",
    "frame_length_ms",
    "hop_length_ms",
    "min_frequency",
    "max_frequency",
    "preemphasis",
    "preemphasis_htk_flavor",
    "fft_overdrive",
    "mel_floor",
    "per_bin_mean",
    "per_bin_stddev",
)
#: Settings og cannot apply, and the value at which they change nothing.
_GEMMA4_NEUTRAL = {"dither": 0.0, "input_scale_factor": 1.0}


def feature_extractor_settings(checkpoint: Path) -> tuple[dict[str, Any], Path]:
    """The checkpoint's feature extractor settings and the file they came from: the
    `feature_extractor` of processor_config.json (transformers 5 saves a processor's parts
    there) or of preprocessor_config.json, or preprocessor_config.json itself where it is one;
    {} (the extractor's defaults) where none is."""
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = checkpoint / name
        if not path.is_file():
            continue
        document = read_json_object(path, ConfigError)
        nested = document.get("feature_extractor")
        if isinstance(nested, dict):
            return nested, path
        if "feature_extractor_type" in document:
            return document, path
    return {}, checkpoint / "preprocessor_config.json"


def gemma4_log_mel(settings: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """audio_processor_config.json of Gemma4AudioFeatureExtractor `settings` (from `path`)."""
    for key, neutral in _GEMMA4_NEUTRAL.items():
        value = settings.get(key, neutral)
        if value != neutral:
            raise ConfigError(
                f"{path}: {key} is {value!r}; accepted: {neutral} (onnxruntime-genai's "
                "Gemma4LogMel has no such setting)"
            )
    attrs = {
        key: int(value) if isinstance(value, bool) else value
        for key in _GEMMA4_LOG_MEL_KEYS
        if (value := settings.get(key)) is not None
    }
    return {
        "feature_extraction": {
            "sequence": [
                {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
                {"operation": {"name": "log_mel", "type": "Gemma4LogMel", "attrs": attrs}},
            ]
        }
    }
