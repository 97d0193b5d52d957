"""genai_config's vision and embedding sections and the image processor config of a
vision-language bundle (onnxruntime-genai 0.18's multimodal pipeline).

og runs vision (pixel_values → image_features) → embedding (input_ids + image_features →
inputs_embeds) → decoder, with the image processor of onnxruntime-extensions configured by
`processor_config.json`: {"processor": {"transforms": [...]}}, derived here from the
checkpoint's preprocessor_config.json (transformers' image processor settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mobius_genai._json import read_json_object
from mobius_genai.build import ModelPackage
from mobius_genai.errors import ConfigError
from mobius_genai.tasks.causal_lm import INPUTS_EMBEDS
from mobius_genai.tasks.vision_language import IMAGE_FEATURES, PIXEL_VALUES

PROCESSOR_FILENAME = "processor_config.json"
#: transformers' Gemma3ImageProcessor defaults (IMAGENET_STANDARD_MEAN / _STD, 1 / 255).
_DEFAULT_MEAN = (0.5, 0.5, 0.5)
_DEFAULT_STD = (0.5, 0.5, 0.5)
_DEFAULT_RESCALE = 1 / 255


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
    model["vision"] = {
        "filename": graph_filename("vision"),
        "config_filename": PROCESSOR_FILENAME,
        "inputs": {"pixel_values": PIXEL_VALUES},
        "outputs": {"image_features": IMAGE_FEATURES},
        **session,
    }
    model["embedding"] = {
        "filename": graph_filename("embedding"),
        "inputs": {"input_ids": "input_ids", "image_features": IMAGE_FEATURES},
        "outputs": {"inputs_embeds": INPUTS_EMBEDS},
        **session,
    }


def processor_config(checkpoint: Path, image_size: int) -> dict[str, Any]:
    """onnxruntime-extensions' image pipeline equal to the checkpoint's image processor:
    decode as RGB, resize to the tower's size, rescale, normalize, HWC → CHW."""
    path = checkpoint / "preprocessor_config.json"
    settings = read_json_object(path, ConfigError) if path.is_file() else {}
    size = settings.get("size") or {}
    height = _positive(size.get("height", image_size), path, "size.height")
    width = _positive(size.get("width", image_size), path, "size.width")
    operations = [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        (
            "resize",
            "Resize",
            {"width": width, "height": height, "interpolation": "LINEAR", "keep_aspect_ratio": 0},
        ),
        (
            "rescale",
            "Rescale",
            {"rescale_factor": float(settings.get("rescale_factor", _DEFAULT_RESCALE))},
        ),
        (
            "normalize",
            "Normalize",
            {
                "mean": _floats(settings.get("image_mean", _DEFAULT_MEAN)),
                "std": _floats(settings.get("image_std", _DEFAULT_STD)),
            },
        ),
        ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
    ]
    transforms = [
        {"operation": {"name": name, "type": kind, "attrs": attrs}}
        for name, kind, attrs in operations
    ]
    return {"processor": {"name": "image_processing", "transforms": transforms}}


def _positive(value: Any, path: Path, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{path}: {key} must be a positive integer, found {value!r}")
    return value


def _floats(values: Any) -> list[float]:
    if isinstance(values, int | float):
        return [float(values)] * 3
    return [float(value) for value in values]
