"""Video for a Qwen3-VL bundle through onnxruntime-genai 0.18, which has no video input.

og's API takes images and audios only, and its Qwen processor expands every vision span as an
image. Transformers' Qwen3-VL splits a video's grid per temporal patch (two consecutive frames),
each after the `<t seconds>` timestamp its processor writes, so each temporal patch passed to og
as one image of og.NamedTensors gives transformers' video tokens: the tower and og's m-rope
treat it exactly as transformers treats that patch of the video.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai._json import read_json_object
from mobius_genai.errors import BundleError
from mobius_genai.kinds.og_types import OG_PROCESSOR_FILES
from mobius_genai.runtime.placeholders import require_media

_VIDEO_TYPES = ("qwen3_vl",)
#: How `video_inputs` takes images and clips (none), which a refusal names.
_VIDEO_MEDIA = {
    "image": "image given (video_inputs places the video's frames itself and takes no image)",
    "clip": "clip given (video_inputs takes no audio)",
}


def _transform(transforms: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    for transform in transforms:
        if transform["operation"]["type"] == kind:
            return transform["operation"].get("attrs", {})
    return {}


def _patches(frames: np.ndarray, transforms: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """[temporal patches, h, w] merge-ordered patch rows of uint8 `frames` [f, h, w, 3], as
    transformers' video processor cuts them (f a multiple of the temporal patch size)."""
    scale = _transform(transforms, "Rescale").get("rescale_factor", 1 / 255)
    normalize = _transform(transforms, "Normalize")
    patching = _transform(transforms, "PatchImage")
    patch, merge = patching["patch_size"], patching["merge_size"]
    temporal = patching["temporal_patch_size"]
    count, height, width, _ = frames.shape
    video = (frames * scale - np.array(normalize["mean"])) / np.array(normalize["std"])
    grid_t, grid_h, grid_w = count // temporal, height // patch, width // patch
    blocks = (
        video.astype(np.float32)
        .transpose(0, 3, 1, 2)
        .reshape(grid_t, temporal, 3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    )
    ordered = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(ordered.reshape(grid_t * grid_h * grid_w, -1))


def _checked_frames(folder: Path, frames: np.ndarray, temporal: int, side: int) -> np.ndarray:
    """`frames` as uint8 [f, h, w, 3], the last frame repeated to a whole temporal patch (as
    transformers pads); a BundleError for any other shape."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise BundleError(
            f"{folder}: video frames of dtype {frames.dtype} and shape {list(frames.shape)}; "
            "accepted: uint8 [frames, height, width, 3] (RGB)"
        )
    if frames.shape[1] % side or frames.shape[2] % side:
        raise BundleError(
            f"{folder}: video frames are {frames.shape[2]}x{frames.shape[1]}; accepted: width "
            f"and height multiples of {side} (patch size x merge size), resized beforehand"
        )
    short = -len(frames) % temporal
    return np.concatenate([frames, np.repeat(frames[-1:], short, axis=0)]) if short else frames


def video_inputs(
    bundle: str | Path,
    model: og.Model,
    frames: np.ndarray,
    prompt: str,
    fps: float,
    frame_indices: Sequence[int] | None = None,
) -> og.NamedTensors:
    """og inputs for a Qwen3-VL `bundle` (opened as `model`): the video `frames` (uint8
    [f, h, w, 3], sampled at `frame_indices` of a video of `fps` frames a second; default
    0..f-1), each temporal patch after its `<t seconds>` timestamp, then `prompt`; an
    OptionError for a `prompt` holding an image placeholder or the image token."""
    folder = Path(bundle)
    genai_config = read_json_object(folder / "genai_config.json", BundleError)
    config = genai_config["model"]
    if config["type"] not in _VIDEO_TYPES or "vision" not in config:
        raise BundleError(
            f"{folder}: model.type {config['type']!r} takes no video here; accepted: a "
            f"vision-language bundle of model.type {', '.join(_VIDEO_TYPES)}"
        )
    # an image token or placeholder in `prompt` would outnumber the frames' features
    require_media(folder, genai_config, prompt, given_as=_VIDEO_MEDIA)
    processor = read_json_object(
        folder / config["vision"].get("config_filename", OG_PROCESSOR_FILES["vision"]),
        BundleError,
    )
    transforms = processor["processor"]["transforms"]
    patching = _transform(transforms, "PatchImage")
    temporal, merge = patching["temporal_patch_size"], patching["merge_size"]
    indices = list(range(len(frames)) if frame_indices is None else frame_indices)
    if len(indices) != len(frames):
        raise BundleError(
            f"{folder}: {len(indices)} frame indices for {len(frames)} video frames; accepted: "
            "one index (its frame's place in the video) per frame"
        )
    frames = _checked_frames(folder, frames, temporal, patching["patch_size"] * merge)
    indices += indices[-1:] * (len(frames) - len(indices))
    grid = (
        len(frames) // temporal,
        *(side // patching["patch_size"] for side in frames.shape[1:3]),
    )
    pads = "<|image_pad|>" * (grid[1] * grid[2] // merge**2)
    times = [
        (indices[i] + indices[i + temporal - 1]) / 2 / fps for i in range(0, len(indices), temporal)
    ]
    text = "".join(f"<{t:.1f} seconds><|vision_start|>{pads}<|vision_end|>" for t in times)
    ids = np.asarray(og.Tokenizer(model).encode(text + prompt), np.int32)[None]
    inputs = og.NamedTensors()
    inputs["input_ids"] = ids
    inputs["pixel_values"] = _patches(frames, transforms)
    inputs["image_grid_thw"] = np.array([[1, grid[1], grid[2]]] * grid[0], np.int64)
    inputs["num_image_tokens"] = np.array([int((ids == config["image_token_id"]).sum())])
    return inputs
