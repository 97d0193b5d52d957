"""Run a bundle with onnxruntime-genai: load it, generate greedily; its chat template, images.

Shared by the smoke test (greedy tokens) and the commands that run a bundle (`decoding`).
onnxruntime-genai errors become BundleErrors naming the bundle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai._json import read_json
from mobius_genai.bundle.bundle_folder import require_bundle
from mobius_genai.bundle.chat_template import check_chat_template
from mobius_genai.bundle.mtp_config import head_overlay
from mobius_genai.errors import BundleError
from mobius_genai.kinds.og_types import image_types, og_type
from mobius_genai.runtime.image_bytes import image_refusal

#: bundle/genai_config.py's CONFIG_FILENAME, without its imports (the smoke test's process)
_GENAI_CONFIG = "genai_config.json"


def load_model(
    folder: str | Path,
    *,
    cpu: bool = False,
    session_options: Mapping[str, str] | None = None,
    provider: tuple[str | None, Mapping[str, str]] | None = None,
    search: Mapping[str, Any] | None = None,
    mtp_head: bool = False,
) -> og.Model:
    """og.Model of the bundle in `folder`; `cpu=True` ignores its provider_options, and
    `provider` (an onnxruntime-genai provider name, None for CPU, and its options) replaces them.
    `mtp_head=True` loads the bundle's MTP head instead (genai_config's `mtp` section as the
    decoder: bundle/mtp_config.py), og.MtpGenerator's second model.

    `session_options` are laid over the decoder's session_options for this load only (ORT
    config entries such as ``session.disable_prepacking``), and `search` over its search
    settings (do_sample, temperature, top_p, top_k, random_seed: what og.Generator and og.Engine
    both read); the bundle is not changed.
    """
    require_bundle(folder)
    cpu = cpu or (provider is not None and provider[0] is None)
    try:
        config = og.Config(str(folder))
        if mtp_head:
            genai_config = read_json(Path(folder) / _GENAI_CONFIG, BundleError, _GENAI_CONFIG)
            config.overlay(json.dumps(head_overlay(genai_config)))
        if cpu or provider is not None:
            config.clear_providers()
        if provider is not None and provider[0] is not None:
            config.append_provider(provider[0])
            for key, value in provider[1].items():
                config.set_provider_option(provider[0], key, value)
        overlay: dict[str, Any] = {"model": {}}
        if cpu or provider is not None:
            overlay["model"] = _other_graphs_providers(folder, provider)
        if session_options:
            overlay["model"]["decoder"] = {"session_options": dict(session_options)}
        if search:
            overlay["search"] = dict(search)
        if not overlay["model"]:
            del overlay["model"]
        if overlay:
            config.overlay(json.dumps(overlay))
        return og.Model(config)
    except Exception as error:  # og raises RuntimeError for every load failure
        where = " on CPU" if cpu else ""
        raise BundleError(
            f"{folder}: onnxruntime-genai cannot load the bundle{where}: {error}"
        ) from error


def _other_graphs_providers(
    folder: str | Path, provider: tuple[str | None, Mapping[str, str]] | None
) -> dict[str, Any]:
    """The overlay that gives every graph besides the decoder (a vision-language bundle's
    vision and embedding sessions) the provider `provider` names, or the CPU's (None):
    og.Config.clear_providers and append_provider change the decoder's alone."""
    from mobius_genai.bundle.validate import read_genai_config

    name, options = provider if provider is not None else (None, {})
    entries = [] if name is None else [{name: dict(options)}]
    return {
        key: {"session_options": {"provider_options": entries}}
        for key, section in read_genai_config(Path(folder))["model"].items()
        if key != "decoder" and isinstance(section, dict) and "session_options" in section
    }


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
            f"(model.type {', '.join(image_types())})"
        )
    placeholder = og_type(model_type).image_placeholder
    if placeholder is None:
        raise BundleError(
            f"{folder}: no image placeholder known for model.type {model_type!r}; accepted: "
            f"{', '.join(image_types())}"
        )
    return placeholder


def open_images(paths: Sequence[str | Path]) -> og.Images:
    """og.Images of PNG or JPEG files; anything else is a BundleError naming the file.

    Each file is checked first (`image_bytes.image_refusal`): onnxruntime-extensions hands
    every other file, and damaged JPEG markers, to libjpeg, which ends the whole process
    ("Not a JPEG file") instead of raising.
    """
    for path in paths:
        if not Path(path).is_file():
            raise BundleError(f"{path}: not a file; accepted: a PNG or JPEG image file")
        refusal = image_refusal(Path(path).read_bytes())
        if refusal is not None:
            raise BundleError(f"{path}: {refusal}")
    return og.Images.open(*(str(path) for path in paths))


def processor_inputs(model: og.Model, text: str, sources: str, **media: Any) -> og.NamedTensors:
    """The multimodal processor's inputs for `text` and its `media` (images=og.Images,
    audios=og.Audios; read from `sources`, named in errors)."""
    try:
        return model.create_multimodal_processor()(text, **media)
    except RuntimeError as error:  # og's error for an unreadable file or a prompt it rejects
        what = "the image" if "audios" not in media else "the audio"
        raise BundleError(f"{sources}: onnxruntime-genai cannot process {what}: {error}") from error


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
