"""Run a bundle with onnxruntime-genai: load it, generate greedily, stream text.

Shared by the smoke test (greedy tokens) and `mobius-genai run` (streamed text with the
bundle's chat template). onnxruntime-genai errors become BundleErrors naming the bundle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai.bundle.bos import required_bos, with_bos
from mobius_genai.bundle.bundle_folder import require_bundle
from mobius_genai.bundle.chat_template import check_chat_template
from mobius_genai.errors import BundleError

#: The text onnxruntime-genai's multimodal processor expands to an image's tokens, per model.type.
IMAGE_PLACEHOLDERS = {
    "gemma3": "<start_of_image>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"


def load_model(
    folder: str | Path,
    *,
    cpu: bool = False,
    session_options: Mapping[str, str] | None = None,
    provider: tuple[str | None, Mapping[str, str]] | None = None,
) -> og.Model:
    """og.Model of the bundle in `folder`; `cpu=True` ignores its provider_options, and
    `provider` (an onnxruntime-genai provider name, None for CPU, and its options) replaces them.

    `session_options` are laid over the decoder's session_options for this load only (ORT
    config entries such as ``session.disable_prepacking``); the bundle is not changed.
    """
    require_bundle(folder)
    cpu = cpu or (provider is not None and provider[0] is None)
    try:
        config = og.Config(str(folder))
        if cpu or provider is not None:
            config.clear_providers()
        if provider is not None and provider[0] is not None:
            config.append_provider(provider[0])
            for key, value in provider[1].items():
                config.set_provider_option(provider[0], key, value)
        if session_options:
            overlay = {"model": {"decoder": {"session_options": dict(session_options)}}}
            config.overlay(json.dumps(overlay))
        return og.Model(config)
    except Exception as error:  # og raises RuntimeError for every load failure
        where = " on CPU" if cpu else ""
        raise BundleError(
            f"{folder}: onnxruntime-genai cannot load the bundle{where}: {error}"
        ) from error


def load_tokenizer(model: og.Model, folder: str | Path) -> og.Tokenizer:
    """og.Tokenizer of a loaded bundle."""
    try:
        return og.Tokenizer(model)
    except Exception as error:
        raise BundleError(
            f"{folder}: onnxruntime-genai cannot load the tokenizer: {error}"
        ) from error


def greedy_tokens(
    model: og.Model, prompt_ids: Sequence[int] | og.NamedTensors, max_length: int
) -> list[int]:
    """Tokens onnxruntime-genai generates greedily after `prompt_ids`, up to `max_length` in all.

    `prompt_ids` may be a multimodal processor's output (input_ids with pixel_values).

    Repetition penalty is forced to 1.0 so the result is plain argmax decoding; a failing
    session run, or logits that are not finite, become a BundleError.
    """
    tokens: list[int] = []
    try:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=max_length, repetition_penalty=1.0)
        generator = og.Generator(model, params)
        if isinstance(prompt_ids, og.NamedTensors):
            generator.set_inputs(prompt_ids)
        else:
            generator.append_tokens(list(prompt_ids))
        while not generator.is_done():
            require_finite(generator.get_logits()[0, -1], len(tokens), "onnxruntime-genai")
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
    except BundleError:
        raise
    except Exception as error:  # og raises RuntimeError when a session run fails
        raise BundleError(
            f"onnxruntime-genai failed after {len(tokens)} generated tokens: {error}"
        ) from error
    return tokens


def image_placeholder(folder: str | Path, config: Mapping[str, Any]) -> str:
    """The image placeholder of a vision-language bundle's prompts; a BundleError for a
    text-only bundle (no model.vision in its genai_config) or a type without a known one."""
    model_type = config["model"]["type"]
    if "vision" not in config["model"]:
        raise BundleError(
            f"{folder}: a text-only bundle (model.type {model_type!r}, no model.vision in "
            f"genai_config.json) takes no images; accepted: a vision-language bundle "
            f"(model.type {', '.join(sorted(IMAGE_PLACEHOLDERS))})"
        )
    if model_type not in IMAGE_PLACEHOLDERS:
        raise BundleError(
            f"{folder}: no image placeholder known for model.type {model_type!r}; accepted: "
            f"{', '.join(sorted(IMAGE_PLACEHOLDERS))}"
        )
    return IMAGE_PLACEHOLDERS[model_type]


def open_images(paths: Sequence[str | Path]) -> og.Images:
    """og.Images of PNG or JPEG files; anything else is a BundleError naming the file.

    Checked by signature first: onnxruntime-extensions hands every other file to its JPEG
    decoder, which ends the whole process ("Not a JPEG file") instead of raising.
    """
    for path in paths:
        if not Path(path).is_file():
            raise BundleError(f"{path}: not a file; accepted: a PNG or JPEG image file")
        with open(path, "rb") as file:
            head = file.read(len(_PNG_SIGNATURE))
        if not head.startswith((_PNG_SIGNATURE, _JPEG_SIGNATURE)):
            raise BundleError(
                f"{path}: not a PNG or JPEG image (starts with {head[:4]!r}); accepted: the "
                "image formats onnxruntime-genai's processor decodes, PNG and JPEG"
            )
    return og.Images.open(*(str(path) for path in paths))


def image_inputs(model: og.Model, text: str, images: og.Images, sources: str) -> og.NamedTensors:
    """The multimodal processor's input_ids and pixel_values for `text` and `images` (read
    from `sources`, named in errors)."""
    try:
        return model.create_multimodal_processor()(text, images=images)
    except RuntimeError as error:  # og's error for an unreadable image or a prompt it rejects
        raise BundleError(
            f"{sources}: onnxruntime-genai cannot process the image: {error}"
        ) from error


def require_finite(logits: np.ndarray, step: int, runner: str) -> None:
    """BundleError when `logits` (of the prompt at step 0, of generated token `step` after it)
    hold NaN or infinity; `runner` names what computed them."""
    finite = np.isfinite(logits)
    if finite.all():
        return
    bad = "NaN" if np.isnan(logits).any() else "infinity"
    where = "the prompt (step 0)" if step == 0 else f"generated token {step} (step {step})"
    raise BundleError(
        f"{runner} computed logits that are not finite for {where}: {bad} in "
        f"{int((~finite).sum())} of {finite.size}; the weights or the graph's arithmetic (e.g. "
        "a float16 overflow) produce them"
    )


def chat_template(folder: str | Path) -> str | None:
    """The bundle's chat template (chat_template.jinja, chat_template.json or tokenizer_config),
    checked before this process renders it: within the size bound, and rendered by
    onnxruntime-genai in a process of its own without crashing (`bundle.chat_template`)."""
    return check_chat_template(folder)


def stream_text(
    folder: str | Path,
    prompt: str,
    *,
    max_new_tokens: int = 128,
    use_chat_template: bool = True,
    images: Sequence[str | Path] = (),
    search_options: Mapping[str, Any] | None = None,
    ep: str | None = None,
) -> Iterator[str]:
    """Text pieces generated for `prompt` with the bundle's own search settings, overridden by
    `search_options` (onnxruntime-genai's: do_sample, temperature, top_p, top_k, random_seed).

    With `images` (files), the prompt goes through the multimodal processor with them; it gets
    the model type's image placeholder in front for each image it does not place itself. `ep`
    runs the bundle on that EP's provider instead of its own (`placement`).
    """
    require_bundle(folder)
    # here, not at the top: the smoke test's process imports this module without the EP tables
    from mobius_genai.bundle.placement import provider_hints, provider_of, require_runnable
    from mobius_genai.bundle.validate import read_genai_config

    config = read_genai_config(Path(folder))

    provider = None if ep is None else provider_of(ep)
    require_runnable(folder, config, provider)
    text = prompt
    if images:
        placeholder = image_placeholder(folder, config)
        text = " ".join([placeholder] * (len(images) - text.count(placeholder)) + [text])
        pictures = open_images(images)
    with provider_hints(folder, config):
        model = load_model(folder, provider=provider)
    template = chat_template(folder)  # checked before og's tokenizer here parses it
    tokenizer = load_tokenizer(model, folder)
    template = template if use_chat_template else None
    try:
        if template is not None:
            messages = json.dumps([{"role": "user", "content": text}])
            text = tokenizer.apply_chat_template(
                messages, template_str=template, add_generation_prompt=True
            )
        if images:
            inputs = image_inputs(model, text, pictures, ", ".join(map(str, images)))
            length = inputs["input_ids"].as_numpy().size
        else:
            prompt_ids = with_bos(tokenizer.encode(text), required_bos(folder))
            length = len(prompt_ids)
        params = og.GeneratorParams(model)
        context = config["model"]["context_length"]
        max_length = min(length + max_new_tokens, context)
        params.set_search_options(**(search_options or {}), max_length=max_length)
        generator = og.Generator(model, params)
        if images:
            generator.set_inputs(inputs)
        else:
            generator.append_tokens(prompt_ids)
        stream = tokenizer.create_stream()
        while not generator.is_done():
            generator.generate_next_token()
            yield stream.decode(generator.get_next_tokens()[0])
    except RuntimeError as error:  # og's error type for template, tokenizer and run failures
        raise BundleError(f"{folder}: onnxruntime-genai failed to generate: {error}") from error
