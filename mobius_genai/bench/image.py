"""`bench --image [FILE]`: a vision-language bundle's time to the first token with an image
(og's processor decoding and resizing it, the vision graph, the prompt), against the same
prompt without it, and the tokens/s after it: what an image costs a `serve` request. Without
FILE, a generated image at the processor's size (the smoke test's) is the image."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnxruntime_genai as og

from mobius_genai.bench.speed import FirstTokenBench, first_token_medians
from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.ep import HOST_EP
from mobius_genai.errors import OptionError
from mobius_genai.runtime.generate import image_placeholder, processor_inputs
from mobius_genai.runtime.image_bytes import image_refusal
from mobius_genai.runtime.opening import open_bundle
from mobius_genai.runtime.placement import provider_of
from mobius_genai.runtime.smoke_image import (
    SMOKE_IMAGE_TEXT,
    png_bytes,
    processor_size,
    smoke_pixels,
)

#: The prompt after the image's placeholder.
BENCH_PROMPT = SMOKE_IMAGE_TEXT


@dataclasses.dataclass(frozen=True)
class ImageBench(FirstTokenBench):
    width: int | None  # of the generated image; None for a file's
    height: int | None

    @property
    def image_cost(self) -> float:
        return self.cost


def bench_image(
    folder: str | Path,
    image: bytes | None,
    *,
    rounds: int,
    cpu: bool,
    threads: int | None,
    new_tokens: int = 32,
) -> ImageBench:
    """The medians of `rounds` timed generations of `new_tokens` after the image (`image`'s
    bytes, None: a generated one) and BENCH_PROMPT, after a warm-up, and of the prompt alone."""
    config = read_genai_config(Path(folder))
    placeholder = image_placeholder(folder, config)
    size = (None, None)
    if image is None:
        size = processor_size(Path(folder), config)
        image = png_bytes(smoke_pixels(size[1], size[0]))
    refusal = image_refusal(image)
    if refusal is not None:
        raise OptionError(f"--image: {refusal}")
    bundle = open_bundle(
        folder, command="bench", provider=provider_of(HOST_EP) if cpu else None, threads=threads
    )
    text = f"{placeholder} {BENCH_PROMPT}"

    def inputs() -> og.NamedTensors:
        return processor_inputs(bundle.model, text, "--image", images=og.Images.open_bytes(image))

    try:
        medians = first_token_medians(bundle, inputs, BENCH_PROMPT, rounds, new_tokens)
    except RuntimeError as error:
        raise bundle.failure("generate after the image", error) from error
    return ImageBench(width=size[0], height=size[1], **medians)
