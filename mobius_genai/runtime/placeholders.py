"""A prompt's image and audio placeholders checked against the files given, before og runs.

og's multimodal processor expands each placeholder of the bundle's og type (kinds/og_types.py:
`image_placeholder` with a vision graph, `audio_placeholder` with a speech graph) to one
image's or clip's tokens. A placeholder with no file behind it, or the token an image's
features fill written out (`image_token`, Gemma 4's `<|image|>`), reaches the model as tokens
with no features to take: the embedding graph takes them as text, as transformers does without
pixel values, which is not what the prompt meant, and beside an image they outnumber its
features, which fails inside og's session run ("Gather ... out of bounds") as transformers
refuses them. `run`, `chat`, serve's chat completions and `video_inputs` refuse such a prompt
first, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_genai.errors import OptionError
from mobius_genai.kinds.og_types import og_type
from mobius_genai.runtime.audio import prompt_audio

__all__ = ["RUN_MEDIA", "require_media"]

#: How `run` takes an image and a clip, which a refusal names.
RUN_MEDIA = {
    "image": "file of `run --image FILE` (put in front of a prompt that leaves it out)",
    "clip": "file of `run --audio FILE` (put in front of a prompt that leaves it out)",
}


def require_media(
    folder: str | Path,
    config: Mapping[str, Any],
    text: str,
    *,
    images: int = 0,
    audios: int = 0,
    given_as: Mapping[str, str] = RUN_MEDIA,
) -> None:
    """An OptionError when `text` places more images or clips than those given (`images`,
    `audios`, each given as `given_as` says); the placeholders of a bundle without the graph
    that reads them are plain text."""
    model = config["model"]
    row = og_type(model["type"])
    vision = "vision" in model
    if vision and _loose_image_tokens(row.image_token, row.image_placeholder, text):
        raise OptionError(
            f"{folder}: the prompt holds {row.image_token}, the token og fills with an image's "
            f"features; accepted: {row.image_placeholder} to place an image (one per "
            f"{given_as['image']}), or a prompt without it"
        )
    image = row.image_placeholder if vision else None
    media = ((image, images, "image"), (prompt_audio(config), audios, "clip"))
    for placeholder, given, noun in media:
        placed = 0 if placeholder is None else text.count(placeholder)
        if placed > given:
            raise OptionError(
                f"{folder}: the prompt places {placed} {placeholder} but {given} {noun}(s) "
                f"are given; accepted: at most one {placeholder} per {given_as[noun]}, or a "
                "prompt without it"
            )


def _loose_image_tokens(token: str | None, placeholder: str | None, text: str) -> bool:
    """Whether `text` holds the image `token` outside the image placeholders (Qwen's
    `<|image_pad|>` is inside its placeholder; Gemma 4's `<|image|>` is not)."""
    if token is None or placeholder is None:
        return False
    return text.count(token) > text.count(placeholder) * placeholder.count(token)
