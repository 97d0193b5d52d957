"""genai_config's vision and embedding sections and the image processor config of a
vision-language bundle (onnxruntime-genai 0.18's multimodal pipeline).

og runs vision (pixel_values → image_features) → embedding (input_ids + image_features →
inputs_embeds) → decoder, with the image processor of onnxruntime-extensions configured by
`processor_config.json`: {"processor": {"transforms": [...]}}, derived here from the
checkpoint's preprocessor_config.json (transformers' image processor settings).

Qwen2.5-VL (og's QwenImageProcessor): images keep their aspect ratio (smart_resize to a
multiple of patch_size * merge_size pixels within [min_pixels, max_pixels]) and PatchImage cuts
them into transformers' flattened patches and their image_grid_thw; og computes the decoder's
3-D mrope position_ids from the model-level token ids and the vision section's sizes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json_object
from mobius_genai.build import ModelPackage
from mobius_genai.config.qwen_vision import QwenVisionConfig
from mobius_genai.config.vision import VisionConfig
from mobius_genai.errors import ConfigError
from mobius_genai.tasks.causal_lm import INPUTS_EMBEDS
from mobius_genai.tasks.vision_language import IMAGE_FEATURES

PROCESSOR_FILENAME = "processor_config.json"
#: transformers' Gemma3ImageProcessor defaults (IMAGENET_STANDARD_MEAN / _STD, 1 / 255).
_DEFAULT_MEAN = (0.5, 0.5, 0.5)
_DEFAULT_STD = (0.5, 0.5, 0.5)
_DEFAULT_RESCALE = 1 / 255
#: transformers' Qwen2VLImageProcessor defaults (OPENAI_CLIP_MEAN / _STD, 56² to 28² · 16384).
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_QWEN_MIN_PIXELS, _QWEN_MAX_PIXELS = 56 * 56, 28 * 28 * 16384


def graph_filename(key: str) -> str:
    """The file a package key's graph is saved as (ModelPackage.save)."""
    return f"{key}.onnx"


def add_vision_language(genai_config: dict[str, Any], built: ModelPackage) -> None:
    """Turn the decoder's genai_config into the vision-language pipeline's, in place."""
    family = built.family
    model = genai_config["model"]
    model["type"] = family.genai_type  # type: ignore[union-attr]
    decoder = model["decoder"]
    decoder["inputs"] = {INPUTS_EMBEDS: INPUTS_EMBEDS, **decoder["inputs"]}
    session = {"session_options": dict(decoder["session_options"])}
    vision_inputs = {value.name: value.name for value in built["vision"].graph.inputs}
    model["vision"] = {
        "filename": graph_filename("vision"),
        "config_filename": PROCESSOR_FILENAME,
        **_vision_sizes(built.vision_language.vision),  # type: ignore[union-attr]
        "inputs": vision_inputs,
        "outputs": {"image_features": IMAGE_FEATURES},
        **session,
    }
    model.update(_position_token_ids(built.vision_language))
    model["embedding"] = {
        "filename": graph_filename("embedding"),
        "inputs": {"input_ids": "input_ids", "image_features": IMAGE_FEATURES},
        "outputs": {"inputs_embeds": INPUTS_EMBEDS},
        **session,
    }


def _vision_sizes(vision: VisionConfig | QwenVisionConfig) -> dict[str, Any]:
    """The vision section's size keys og reads for Qwen2.5-VL (none for a SigLIP tower)."""
    if not isinstance(vision, QwenVisionConfig):
        return {}
    return {
        "spatial_merge_size": vision.spatial_merge_size,
        "patch_size": vision.patch_size,
        "tokens_per_second": float(vision.tokens_per_second),
        "window_size": vision.window_size,
    }


def _position_token_ids(config: Any) -> dict[str, int]:
    """The model-level token ids og's 3-D mrope positions read (Qwen2.5-VL), else none."""
    if config.vision_start_token_id is None:
        return {}
    return {
        "image_token_id": config.image_token_id,
        "video_token_id": config.video_token_id,
        "vision_start_token_id": config.vision_start_token_id,
    }


def processor_config(checkpoint: Path, built: ModelPackage) -> dict[str, Any]:
    """onnxruntime-extensions' image pipeline equal to the checkpoint's image processor."""
    path = checkpoint / "preprocessor_config.json"
    settings = read_json_object(path, ConfigError) if path.is_file() else {}
    vision = built.vision_language.vision  # type: ignore[union-attr]
    if isinstance(vision, QwenVisionConfig):
        operations = _patch_operations(settings, vision, path)
    else:
        operations = _square_operations(settings, vision.image_size, path)
    transforms = [
        {"operation": {"name": name, "type": kind, "attrs": attrs}}
        for name, kind, attrs in operations
    ]
    return {"processor": {"name": "image_processing", "transforms": transforms}}


def _normalization(settings: dict[str, Any], mean: Any, std: Any) -> list[tuple[str, str, dict]]:
    return [
        (
            "rescale",
            "Rescale",
            {"rescale_factor": float(settings.get("rescale_factor", _DEFAULT_RESCALE))},
        ),
        (
            "normalize",
            "Normalize",
            {
                "mean": _floats(settings.get("image_mean", mean)),
                "std": _floats(settings.get("image_std", std)),
            },
        ),
    ]


def _patch_operations(
    settings: dict[str, Any], vision: QwenVisionConfig, path: Path
) -> list[tuple[str, str, dict]]:
    """Qwen2VLImageProcessor: decode as RGB, smart_resize (bicubic), rescale, normalize, cut
    into patches. Resize's width and height are an image smart_resize keeps as it is: the
    smallest square of whole merged tokens holding min_pixels (og reads them only without
    smart_resize; the smoke test makes its image at that size)."""
    size = settings.get("size") or {}
    low = _positive(
        settings.get("min_pixels", size.get("shortest_edge", _QWEN_MIN_PIXELS)), path, "min_pixels"
    )
    high = _positive(
        settings.get("max_pixels", size.get("longest_edge", _QWEN_MAX_PIXELS)), path, "max_pixels"
    )
    factor = vision.patch_size * vision.spatial_merge_size
    side = max(factor, math.ceil(math.sqrt(low) / factor) * factor)
    resize = {
        "width": side,
        "height": side,
        "smart_resize": 1,
        "min_pixels": low,
        "max_pixels": high,
        "patch_size": vision.patch_size,
        "merge_size": vision.spatial_merge_size,
        "interpolation": "CUBIC",
    }
    patch = {
        "patch_size": vision.patch_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "merge_size": vision.spatial_merge_size,
    }
    return [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        ("resize", "Resize", resize),
        *_normalization(settings, _CLIP_MEAN, _CLIP_STD),
        ("patch_image", "PatchImage", patch),
    ]


def _square_operations(
    settings: dict[str, Any], image_size: int, path: Path
) -> list[tuple[str, str, dict]]:
    """Decode as RGB, resize to the tower's size, rescale, normalize, HWC → CHW."""
    size = settings.get("size") or {}
    height = _positive(size.get("height", image_size), path, "size.height")
    width = _positive(size.get("width", image_size), path, "size.width")
    return [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        (
            "resize",
            "Resize",
            {"width": width, "height": height, "interpolation": "LINEAR", "keep_aspect_ratio": 0},
        ),
        *_normalization(settings, _DEFAULT_MEAN, _DEFAULT_STD),
        ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
    ]


def _positive(value: Any, path: Path, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{path}: {key} must be a positive integer, found {value!r}")
    return value


def _floats(values: Any) -> list[float]:
    if isinstance(values, int | float):
        return [float(values)] * 3
    return [float(value) for value in values]
