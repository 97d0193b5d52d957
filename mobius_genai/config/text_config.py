"""The text decoder's keys of a multimodal config.json (a nested `text_config`).

Vision-language rows (models/vision_language.py) and text-only rows of the family table
(`TextOnly`: a multimodal checkpoint built as a bundle of its text decoder alone) read them
the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields


def nested_text_keys(
    raw: Mapping[str, Any],
    defaults: Mapping[str, Any],
    top_level_keys: tuple[str, ...],
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Text keys from `text_config`, or from the top level of a flat hub config.json, over
    transformers' text `defaults` for keys hub configs omit; `top_level_keys` (flags) are read
    from the top level where `text_config` lacks them or where the top level sets them true
    (Qwen2_5_VLConfig forwards a true text_config tie_word_embeddings to the top level, and the
    model ties by the top level's). A default yields to its key's `aliases` (alias → key, as
    transformers' attribute_map: num_local_experts sets num_experts)."""
    if raw.get("text_config") is None:
        text_keys = {k: v for k, v in raw.items() if k != "vision_config"}
    else:
        text_keys = dict(fields.mapping(raw.get("text_config"), "text_config"))
        for key in top_level_keys:
            if raw.get(key) is not None and (text_keys.get(key) is None or raw[key] is True):
                text_keys[key] = raw[key]
    aliased = {key for alias, key in (aliases or {}).items() if text_keys.get(alias) is not None}
    return {**{k: v for k, v in defaults.items() if k not in aliased}, **text_keys}


@dataclasses.dataclass(frozen=True)
class TextOnly:
    """A multimodal model_type built as a text-only bundle: where its config.json keeps the
    decoder's keys, and what of the checkpoint the bundle does not hold (said by `package`,
    the manifest and the card, so that nobody takes it for a multimodal bundle)."""

    not_built: str
    # transformers' text-config defaults for keys hub configs omit.
    text_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Keys transformers' multimodal model reads from the top level of config.json, whatever
    # `text_config` says (tie_word_embeddings), → the multimodal config class's default.
    top_level_keys: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def text_keys(self, raw: Mapping[str, Any], model_type: str) -> dict[str, Any]:
        """The decoder's config.json keys, under `model_type`."""
        text = nested_text_keys(raw, self.text_defaults, ())
        for key, default in self.top_level_keys.items():
            text[key] = default if raw.get(key) is None else raw[key]
        return {**text, "model_type": model_type}
