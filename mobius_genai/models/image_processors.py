"""Each tower's image processor as onnxruntime-extensions' transforms, and the vision-section
keys og reads of a tower: facts of a vision-language row (`VisionLanguageFamily`).

og's multimodal processor is configured by `processor_config.json`:
{"processor": {"transforms": [...]}}, derived from the checkpoint's preprocessor_config.json
(transformers' image processor settings) by the row's `image_transforms`.

Qwen2.5-VL (og's QwenImageProcessor): images keep their aspect ratio (smart_resize to a
multiple of patch_size * merge_size pixels within [min_pixels, max_pixels]) and PatchImage cuts
them into transformers' flattened patches and their image_grid_thw; og computes the decoder's
3-D mrope position_ids from the model-level token ids and the vision section's sizes.

Mistral 3 (og's Mistral3ImageProcessor): images keep their size, resized to whole merged
tokens (og's smart_resize; transformers' PixtralImageProcessor fits the longest edge and rounds
up to whole patches instead, so the two agree on images already at such a size), channels
first, then PixtralImageSizes, the image_sizes og reads to expand `[IMG]` into rows of image
tokens closed by `[IMG_BREAK]` and `[IMG_END]`. No ConvertRGB: onnxruntime-extensions'
ConvertRGB swaps the channels to BGR, while transformers' processor feeds RGB.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mobius_genai.config.gemma4_vision import Gemma4VisionConfig
from mobius_genai.config.pixtral import PixtralVisionConfig
from mobius_genai.config.qwen3_vision import Qwen3VisionConfig
from mobius_genai.config.qwen_vision import QwenVisionConfig
from mobius_genai.config.siglip2 import NaflexVisionConfig
from mobius_genai.config.vision import VisionConfig
from mobius_genai.errors import ConfigError

#: One transform: (name, onnxruntime-extensions operation type, attributes).
Transform = tuple[str, str, dict]

#: transformers' Gemma3ImageProcessor defaults (IMAGENET_STANDARD_MEAN / _STD, 1 / 255).
_DEFAULT_MEAN = (0.5, 0.5, 0.5)
_DEFAULT_STD = (0.5, 0.5, 0.5)
_DEFAULT_RESCALE = 1 / 255
#: transformers' Qwen2VLImageProcessor defaults (OPENAI_CLIP_MEAN / _STD, 56² to 28² · 16384).
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_QWEN_MIN_PIXELS, _QWEN_MAX_PIXELS = 56 * 56, 28 * 28 * 16384


def no_vision_keys(vision: VisionConfig) -> dict[str, Any]:
    """A tower og needs no size keys of (SigLIP)."""
    return {}


def qwen_vision_keys(vision: QwenVisionConfig) -> dict[str, Any]:
    """The vision section's size keys og reads for Qwen2.5-VL (and Qwen2-VL, without windows:
    no window_size)."""
    keys = {
        "spatial_merge_size": vision.spatial_merge_size,
        "patch_size": vision.patch_size,
        "tokens_per_second": float(vision.tokens_per_second),
    }
    return keys if vision.window_size is None else {**keys, "window_size": vision.window_size}


def qwen3_vision_keys(vision: Qwen3VisionConfig) -> dict[str, Any]:
    """The vision section's size keys og reads for Qwen3-VL (no windows: no window_size)."""
    return {
        "spatial_merge_size": vision.spatial_merge_size,
        "patch_size": vision.patch_size,
        "tokens_per_second": float(vision.tokens_per_second),
    }


def pixtral_vision_keys(vision: PixtralVisionConfig) -> dict[str, Any]:
    """The vision section's size keys og reads for Mistral 3 (the image tokens of each image)."""
    return {"patch_size": vision.patch_size, "spatial_merge_size": vision.spatial_merge_size}


def _normalization(settings: dict[str, Any], mean: Any, std: Any) -> list[Transform]:
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


def qwen_patch_transforms(
    settings: dict[str, Any], vision: QwenVisionConfig | Qwen3VisionConfig, path: Path
) -> list[Transform]:
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


def pixtral_transforms(
    settings: dict[str, Any], vision: PixtralVisionConfig, path: Path
) -> list[Transform]:
    """PixtralImageProcessor: decode as RGB, resize to whole merged tokens within the longest
    edge (bicubic), rescale, normalize, HWC → CHW, image sizes. Resize's width and height are
    the square of 2 x 2 image tokens, an image both resizes keep as it is (og reads them only
    without smart_resize; the smoke test makes its image at that size)."""
    size = settings.get("size") or {}
    longest = _positive(size.get("longest_edge", vision.image_size), path, "size.longest_edge")
    token = vision.merged_patch
    resize = {
        "width": 2 * token,
        "height": 2 * token,
        "smart_resize": 1,
        "min_pixels": token * token,
        "max_pixels": longest * longest,
        "patch_size": vision.patch_size,
        "merge_size": vision.spatial_merge_size,
        "interpolation": "CUBIC",
    }
    return [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        ("resize", "Resize", resize),
        *_normalization(settings, _CLIP_MEAN, _CLIP_STD),
        ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
        ("pixtral_image_sizes", "PixtralImageSizes", {}),
    ]


def square_transforms(
    settings: dict[str, Any], vision: VisionConfig, path: Path
) -> list[Transform]:
    """Decode as RGB, resize to the tower's size, rescale, normalize, HWC → CHW (SigLIP)."""
    size = settings.get("size") or {}
    height = _positive(size.get("height", vision.image_size), path, "size.height")
    width = _positive(size.get("width", vision.image_size), path, "size.width")
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


#: transformers' Lfm2VlImageProcessor defaults (image tokens an image may become, PIL's
#: resampling by number).
_LFM2_MIN_TOKENS, _LFM2_MAX_TOKENS = 64, 256
_RESAMPLING = {2: "LINEAR", 3: "CUBIC"}


def lfm2_vl_vision_keys(vision: NaflexVisionConfig) -> dict[str, Any]:
    """The vision section's size keys og reads for LFM2-VL (og cuts the patches itself)."""
    return {"patch_size": vision.patch_size, "spatial_merge_size": vision.downsample_factor}


def lfm2_vl_transforms(
    settings: dict[str, Any], vision: NaflexVisionConfig, path: Path
) -> list[Transform]:
    """Lfm2VlImageProcessor without tiling: decode as RGB, smart_resize to a multiple of
    patch_size * downsample_factor pixels within [min_image_tokens, max_image_tokens] tokens,
    rescale, normalize, HWC → CHW and the image's size (og cuts the patches and masks them).
    Resize's width and height are the smallest square smart_resize keeps as it is."""
    factor = vision.patch_size * vision.downsample_factor
    low = _positive(settings.get("min_image_tokens", _LFM2_MIN_TOKENS), path, "min_image_tokens")
    high = _positive(settings.get("max_image_tokens", _LFM2_MAX_TOKENS), path, "max_image_tokens")
    resample = settings.get("resample", 2)
    if resample not in _RESAMPLING:
        raise ConfigError(
            f"{path}: resample is {resample!r}; accepted: {sorted(_RESAMPLING)} (bilinear, bicubic)"
        )
    side = math.ceil(math.sqrt(low)) * factor
    resize = {
        "width": side,
        "height": side,
        "interpolation": _RESAMPLING[resample],
        "smart_resize": 1,
        "min_pixels": low * factor * factor,
        "max_pixels": high * factor * factor,
        "patch_size": vision.patch_size,
        "merge_size": vision.downsample_factor,
    }
    return [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        ("resize", "Resize", resize),
        *_normalization(settings, _DEFAULT_MEAN, _DEFAULT_STD),
        ("to_channel_first", "Permute3D", {"dims": [2, 0, 1]}),
        ("image_sizes", "PixtralImageSizes", {}),
    ]


#: transformers' Gemma4ImageProcessor: the soft-token budgets it accepts, its default.
_GEMMA4_SOFT_TOKENS, _GEMMA4_MAX_SOFT_TOKENS = (70, 140, 280, 560, 1120), 280


def gemma4_transforms(
    settings: dict[str, Any], vision: Gemma4VisionConfig, path: Path
) -> list[Transform]:
    """Gemma4ImageProcessor: decode as RGB, then og's Gemma4ImageTransform (resize keeping the
    aspect ratio within max_soft_tokens pooled tokens, rescale to [0, 1] without normalizing,
    patches and their (column, row)); the tower scales the values itself."""
    budget = settings.get("max_soft_tokens", _GEMMA4_MAX_SOFT_TOKENS)
    if budget not in _GEMMA4_SOFT_TOKENS:
        raise ConfigError(
            f"{path}: max_soft_tokens is {budget!r}; accepted: {list(_GEMMA4_SOFT_TOKENS)}"
        )
    if settings.get("do_normalize", False):
        raise ConfigError(
            f"{path}: do_normalize is true; accepted: false (Gemma 4's tower scales the "
            "rescaled pixels itself, and og's Gemma4ImageTransform does not normalize)"
        )
    transform = {
        "patch_size": vision.patch_size,
        "max_soft_tokens": budget,
        "pooling_kernel_size": vision.pooling_kernel_size,
    }
    return [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        ("gemma4_image_transform", "Gemma4ImageTransform", transform),
    ]
