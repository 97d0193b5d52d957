"""The smoke test's image run for a vision-language bundle (genai_config with `model.vision`).

onnxruntime-genai's multimodal processor turns a prompt with the model type's image
placeholder and a generated image at the processor's size into input_ids and pixel_values, and
the generator runs vision → embedding → decoder. The reference is a plain onnxruntime loop
over the same three graphs fed the processor's tensors: the vision graph once, the embedding
graph every step (the image features on the prompt, an empty [0, hidden] tensor after it, as
onnxruntime-genai does), the decoder with the embedding graph's output.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai._json import read_json_object
from mobius_genai.errors import BundleError
from mobius_genai.kinds.og_types import OG_PROCESSOR_FILES, OG_SECTIONS
from mobius_genai.runtime.audio import prompt_audio, tone_bytes
from mobius_genai.runtime.generate import (
    greedy_tokens,
    image_placeholder,
    load_tokenizer,
    processor_inputs,
)
from mobius_genai.runtime.mrope import mrope_positions
from mobius_genai.runtime.ort_session import ort_session

#: The smoke test's prompt after the model type's image placeholder.
SMOKE_IMAGE_TEXT = "Describe the image."
#: The tone in front of it, for a bundle with a speech graph (Gemma 4 E2B/E4B).
SMOKE_TONE_SECONDS = 1.0
#: The multimodal processor's outputs a vision graph may take.
_IMAGE_TENSORS = ("pixel_values", "image_grid_thw", "image_sizes", "pixel_position_ids")
#: The vision input og makes from image_sizes rather than the processor (LFM2-VL's patch mask).
_PATCH_MASK = "attention_mask"
#: onnxruntime-genai's default for model.vision.spatial_merge_size.
_OG_MERGE_DEFAULT = 2


@dataclasses.dataclass(frozen=True)
class ImagePrompt:
    """What the multimodal processor made of the smoke test's prompt and image."""

    input_ids: list[int]
    images: dict[str, np.ndarray]  # the processor's image tensors (pixel_values, image_grid_thw)
    size: tuple[int, int]  # width, height of the generated image
    # the processor's audio tensors (audio_embeds, audio_attention_mask) of the tone the prompt
    # holds beside the image, for a bundle with a speech graph (Gemma 4 E2B/E4B); else empty
    audio: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def has_vision(config: Mapping[str, Any]) -> bool:
    """Whether genai_config describes a vision-language pipeline."""
    return "vision" in config["model"]


def image_greedy(
    model: og.Model, folder: Path, config: Mapping[str, Any], max_new_tokens: int
) -> tuple[ImagePrompt, list[int], str]:
    """(prompt, generated ids, generated text) of a greedy run with an image."""
    text = f"{image_placeholder(folder, config)} {SMOKE_IMAGE_TEXT}"
    width, height = processor_size(folder, config)
    media = {"images": og.Images.open_bytes(png_bytes(smoke_pixels(height, width)))}
    clip = prompt_audio(config)
    if clip is not None:
        text = f"{clip} {text}"
        media["audios"] = og.Audios.open_bytes(tone_bytes(SMOKE_TONE_SECONDS))
    inputs = processor_inputs(model, text, f"{folder}: the smoke test's media", **media)
    given = set(inputs.keys())  # og.NamedTensors has no `in`
    audio_tensors = OG_SECTIONS["speech"][0].values() if clip is not None else ()
    prompt = ImagePrompt(
        [int(token) for token in inputs["input_ids"].as_numpy().reshape(-1)],
        {name: inputs[name].as_numpy() for name in _IMAGE_TENSORS if name in given},
        (width, height),
        {name: inputs[name].as_numpy() for name in audio_tensors if name in given},
    )
    max_length = min(len(prompt.input_ids) + max_new_tokens, config["model"]["context_length"])
    tokens = greedy_tokens(model, inputs, max_length)
    return prompt, tokens, load_tokenizer(model, folder).decode(tokens)


def image_note(prompt: ImagePrompt) -> str:
    """The smoke note's words for the image, e.g. " with a 64x64 image" (and the tone)."""
    tone = f" and a {SMOKE_TONE_SECONDS:.0f} s tone" if prompt.audio else ""
    return f" with a {prompt.size[0]}x{prompt.size[1]} image{tone}"


def _gemma4_side(attrs: Mapping[str, Any]) -> tuple[int, int]:
    """The largest square of whole pooled tokens within the token budget, which Gemma 4's
    processor keeps as it is."""
    block = int(attrs["patch_size"]) * int(attrs["pooling_kernel_size"])
    side = math.isqrt(int(attrs["max_soft_tokens"])) * block
    return side, side


#: Transform type → (its attributes the size needs, (width, height) from them).
_SIZED_TRANSFORMS: dict[str, tuple[set[str], Callable[[Mapping[str, Any]], tuple[int, int]]]] = {
    "Resize": ({"width", "height"}, lambda attrs: (int(attrs["width"]), int(attrs["height"]))),
    "Gemma4ImageTransform": (
        {"patch_size", "pooling_kernel_size", "max_soft_tokens"},
        _gemma4_side,
    ),
}


def processor_size(folder: Path, config: Mapping[str, Any]) -> tuple[int, int]:
    """(width, height) of an image the image processor takes (its Resize transform's size, or
    one Gemma 4's transform keeps)."""
    name = config["model"]["vision"].get("config_filename", OG_PROCESSOR_FILES["vision"])
    document = read_json_object(folder / name, BundleError, name)
    transforms = document.get("processor", {}).get("transforms", [])
    for transform in transforms:
        operation = transform.get("operation", {})
        attrs = operation.get("attrs", {})
        needed, size = _SIZED_TRANSFORMS.get(operation.get("type"), (None, None))
        if size is not None and needed <= set(attrs):
            return size(attrs)
    raise BundleError(
        f"{folder / name}: no Resize transform with width and height; accepted: the image "
        "processor config `mobius-genai package` writes"
    )


def smoke_pixels(height: int, width: int) -> np.ndarray:
    """The smoke test's image: seeded random RGB pixels [height, width, 3] uint8."""
    return np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of `pixels` [height, width, 3] uint8 (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + row.tobytes() for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def image_embedder(
    folder: Path,
    config: Mapping[str, Any],
    prompt: ImagePrompt,
    entries: Mapping[str, str],
    provider: str,
) -> Callable[[Sequence[int]], dict[str, np.ndarray]]:
    """The decoder's extra inputs per step, from the vision and embedding graphs on CPU.

    The vision graph runs once here and is released; the returned function feeds the new
    tokens to the embedding graph with the image features (and the clip's audio features)
    the first time, an empty [0, hidden] tensor after that and for a feature the prompt has
    none of, and names its output as the decoder input of that name; for a model whose
    positions are 3-D (model.vision_start_token_id: Qwen2.5-VL) it adds the tokens' mrope
    position_ids. `entries` are ORT session config entries, `provider` the
    name of onnxruntime's CPU EP.
    """
    model = config["model"]
    vision = ort_session(folder / model["vision"]["filename"], entries, provider)
    keys = {name: key for key, name in model["vision"].get("inputs", {}).items()}
    feed = {
        name: _vision_input(prompt.images, keys.get(name, name))
        for name in (i.name for i in vision.get_inputs())
    }
    (features,) = vision.run(None, feed)
    del vision
    embedding = ort_session(folder / model["embedding"]["filename"], entries, provider)
    names = model["embedding"].get("inputs", {})
    features_name = names.get("image_features", "image_features")
    pending = {features_name: features}
    if prompt.audio:
        pending[names.get("audio_features", "audio_features")] = _audio_features(
            folder, model["speech"], prompt, entries, provider
        )
    # after the prompt, and for features it has none of (Gemma 4's audio_features without a
    # clip): og's empty [0, hidden]
    idle = {i.name: features[:0] for i in embedding.get_inputs() if i.name != "input_ids"}
    embeds_name = embedding.get_outputs()[0].name

    positions = _positions(config, prompt)

    def embed(new: Sequence[int]) -> dict[str, np.ndarray]:
        given = {name: pending.pop(name) for name in list(pending)}
        feed = {"input_ids": np.asarray([new], np.int64), **idle, **given}
        extra = {embeds_name: embedding.run([embeds_name], feed)[0]}
        if positions is not None:
            extra["position_ids"] = positions(len(new))
        return extra

    return embed


def _audio_features(
    folder: Path,
    section: Mapping[str, Any],
    prompt: ImagePrompt,
    entries: Mapping[str, str],
    provider: str,
) -> np.ndarray:
    """The speech graph's audio_features of the prompt's clip, each input fed the processor's
    tensor og feeds it (og's key → its default name, the processor's tensor)."""
    speech = ort_session(folder / section["filename"], entries, provider)
    tensors, _ = OG_SECTIONS["speech"]
    keys = {name: key for key, name in {**tensors, **section.get("inputs", {})}.items()}
    feed = {i.name: prompt.audio[tensors[keys[i.name]]] for i in speech.get_inputs()}
    (features,) = speech.run(None, feed)
    return features


def _vision_input(images: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    """The processor's tensor og feeds as vision input `key`; og's patch mask: 1 for each
    image's patches (image_sizes' rows x columns), 0 for the padding after them."""
    if key != _PATCH_MASK:
        return images[key]
    patches = images["pixel_values"].shape[1]
    real = np.prod(images["image_sizes"], axis=-1, keepdims=True)
    return (np.arange(patches)[None] < real).astype(np.int64)


def _positions(
    config: Mapping[str, Any], prompt: ImagePrompt
) -> Callable[[int], np.ndarray] | None:
    """position_ids [3, 1, n] of each step's n new tokens: the prompt's mrope positions, then
    one past the largest so far; None for 1-D positions."""
    model = config["model"]
    if "vision_start_token_id" not in model:
        return None
    prompt_positions = mrope_positions(
        prompt.input_ids,
        prompt.images["image_grid_thw"],
        image_token_id=model["image_token_id"],
        vision_start_token_id=model["vision_start_token_id"],
        merge=model["vision"].get("spatial_merge_size", _OG_MERGE_DEFAULT),
    )
    pending = [prompt_positions]
    following = [int(prompt_positions.max()) + 1]

    def positions(count: int) -> np.ndarray:
        if pending:
            return pending.pop()
        start = following[0]
        following[0] += count
        return np.broadcast_to(np.arange(start, start + count), (3, 1, count)).copy()

    return positions
