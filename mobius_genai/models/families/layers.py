"""Per-layer kinds families derive: which layers use a sliding window and which rotate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError, UnsupportedModelError


def alternating_layer_types(pattern: int) -> Callable[[Mapping[str, Any]], list[str]]:
    """Every `pattern`-th layer global, the others sliding (gemma2: 2, gemma3: 6)."""

    def layer_types(raw: Mapping[str, Any]) -> list[str]:
        every = fields.integer(raw.get("sliding_window_pattern"), "sliding_window_pattern", pattern)
        return [
            "sliding_attention" if (i + 1) % every else "full_attention"
            for i in range(fields.require(raw, "num_hidden_layers"))
        ]

    return layer_types


def leading_full_layer_types(pattern: int) -> Callable[[Mapping[str, Any]], list[str]]:
    """Every `pattern`-th layer global from the first one on, the others sliding (cwm: 4)."""

    def layer_types(raw: Mapping[str, Any]) -> list[str]:
        return [
            "sliding_attention" if i % pattern else "full_attention"
            for i in range(fields.require(raw, "num_hidden_layers"))
        ]

    return layer_types


def smollm3_no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """smollm3 lists a use-rope flag per layer; absent, every `interval`-th layer has none."""
    num_layers = fields.require(raw, "num_hidden_layers")
    flags = raw.get("no_rope_layers")
    if flags is None:
        interval = fields.integer(raw.get("no_rope_layer_interval"), "no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    elif not isinstance(flags, list | tuple) or len(flags) != num_layers:
        raise ConfigError(
            f"config.json: field 'no_rope_layers' must be a list of one 0/1 flag per layer "
            f"({num_layers}), found {flags!r}"
        )
    return tuple(i for i, use_rope in enumerate(flags) if not use_rope)


def _switched_layer_types(
    raw: Mapping[str, Any], sliding: Callable[[int], bool]
) -> tuple[str, ...]:
    """Sliding where `sliding(index)` holds, once use_sliding_window is on; else all full."""
    num_layers = fields.require(raw, "num_hidden_layers")
    on = fields.flag(raw.get("use_sliding_window"), "use_sliding_window", False)
    return tuple(
        "sliding_attention" if on and sliding(i) else "full_attention" for i in range(num_layers)
    )


def qwen2_moe_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Qwen2MoeConfig without `layer_types`: with the window on, every other layer (the first,
    third, ...) below `max_window_layers` (28 by default) slides."""
    below = fields.integer(raw.get("max_window_layers"), "max_window_layers", 28, positive=False)
    return _switched_layer_types(raw, lambda i: i % 2 == 0 and i < below)


def every_layer_windowed(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Qwen3MoeConfig has no `layer_types` and ignores `max_window_layers`: with the window on,
    its attention and mask slide in every layer."""
    return _switched_layer_types(raw, lambda _: True)


def smollm3_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """SmolLM3Config without `layer_types`: with the window on and set, the NoPE layers slide."""
    if raw.get("sliding_window") is None:
        return ("full_attention",) * fields.require(raw, "num_hidden_layers")
    no_rope = set(smollm3_no_rope_layers(raw))
    return _switched_layer_types(raw, lambda i: i in no_rope)


def exaone4_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Exaone4Config's layer types: none sliding without a window, else every
    `sliding_window_pattern`-th layer (4 by default) full attention."""
    num_layers = fields.require(raw, "num_hidden_layers")
    if raw.get("sliding_window") is None:
        return ("full_attention",) * num_layers
    if raw.get("layer_types") is not None:
        return tuple(raw["layer_types"])
    key = "sliding_window_pattern"
    if isinstance(raw.get(key), str):
        raise UnsupportedModelError(
            f"config.json: {key} is {raw[key]!r} and layer_types is absent; exaone4 models are "
            "supported with an integer pattern or with layer_types"
        )
    return tuple(alternating_layer_types(4)(raw))


def exaone4_no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """EXAONE 4's hybrid models rotate only in sliding layers (global NoPE); without a window
    every layer rotates."""
    if raw.get("sliding_window") is None:
        return ()
    return tuple(i for i, kind in enumerate(exaone4_layer_types(raw)) if kind == "full_attention")
