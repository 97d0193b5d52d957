"""Rotary position embedding: RopeConfig, its parsing from config.json and its checks.

config.json gives the rope as `rope_theta` + `rope_scaling` (hub checkpoints) or as
`rope_parameters` (transformers 5), possibly per layer type; both parse to the same RopeConfig.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError

# the layer types transformers 5 may nest rope_parameters by (gemma3's full and local ropes)
_ROPE_LAYER_TYPES = ("full_attention", "sliding_attention")

# "proportional" (Gemma 4's full layers): the whole head rotates, with the frequencies of the
# first partial_rotary_factor of its channel pairs and zero (no rotation) for the rest
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "proportional")
# Rope types whose tables depend on the length the model was pretrained with.
_ROPE_TYPES_WITH_ORIGINAL = ("llama3", "yarn", "longrope")
# Keys transformers' rope validation requires per type; rope_theta and
# original_max_position_embeddings get defaults, longrope's factor lists are checked in
# validate_rope, and yarn without factor derives it (as transformers' yarn init does).
_ROPE_REQUIRED_KEYS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding: base, scaling and the part of each head it rotates."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    # longrope's cos/sin scale per factor set, when the checkpoint gives them (phimoe)
    short_mscale: float | None = None
    long_mscale: float | None = None
    partial_rotary_factor: float = 1.0
    interleaved: bool = False
    # Multimodal rope (Qwen2.5-VL): channel pairs per position axis (temporal, height, width),
    # in order, section i rotating by axis i % 3 of 3-D position_ids; None for 1-D positions.
    mrope_section: tuple[int, ...] | None = None
    # Qwen3-VL's layout of the sections: channel pairs cycle temporal, height, width (pair j
    # takes axis j % 3 while that axis' section lasts, the rest temporal) instead of following
    # one another; transformers' Qwen3-VL always interleaves, so its row sets it.
    mrope_interleaved: bool = False
    frequency_factors: tuple[float, ...] | None = None
    """Each frequency divided by its factor after the type's scaling: llama.cpp's rope_freqs
    (a GGUF's Llama 3 scaling), given as `rope_scaling.frequency_factors`."""


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched `scale` times (1 when not stretched)."""
    return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1 else 1.0


def rotated_channels(head_dim: int, partial_rotary_factor: float) -> int:
    """int(head_dim * partial_rotary_factor): the channels transformers rotates."""
    return int(head_dim * partial_rotary_factor)


def axial_rope_parameters(raw: Mapping[str, Any], where: str, model: str) -> Mapping[str, Any]:
    """A vision tower's `rope_parameters` (under `where`), whose rope must be the 2-D axial one
    (columns and rows, the only kind the towers build); `model` names it in the error."""
    rope = fields.mapping(raw.get("rope_parameters"), where + "rope_parameters")
    rope_type = rope.get("rope_type", "axial")
    if rope_type != "axial":
        raise ConfigError(
            f"config.json: field '{where}rope_parameters.rope_type' is {rope_type!r}; "
            f"accepted: 'axial' ({model}'s 2-D rope)"
        )
    return rope


def parse_rope(raw: Mapping[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    """The rope of full-attention layers and, when it differs, the rope of sliding layers.

    transformers 5 nests `rope_parameters` by layer type for models whose local and global
    layers rotate differently (gemma3): {"full_attention": {...}, "sliding_attention": {...}};
    hub checkpoints of gemma3 give the local base as `rope_local_base_freq` instead, the rope
    scaling applying to global layers only.
    """
    params = fields.mapping(raw.get("rope_parameters"), "rope_parameters")
    if any(key in _ROPE_LAYER_TYPES for key in params):
        full, local = (f"rope_parameters.{key}" for key in _ROPE_LAYER_TYPES)
        rope = _rope_from_params(raw, fields.mapping(params.get("full_attention"), full), full)
        local_params = fields.mapping(params.get("sliding_attention"), local)
        return rope, _rope_from_params(raw, local_params, local) if local_params else None
    scaling = fields.mapping(raw.get("rope_scaling"), "rope_scaling")
    params.update({k: v for k, v in scaling.items() if v is not None})
    rope = _rope_from_params(raw, params, "rope_scaling" if scaling else "rope_parameters")
    # the hub layout of gemma3's local rope
    local_theta = fields.number(
        raw.get("rope_local_base_freq"), "rope_local_base_freq", positive=True
    )
    if local_theta is None:
        return rope, None
    local_params = {"rope_type": "default", "rope_theta": local_theta}
    return rope, _rope_from_params(raw, local_params, "rope_local_base_freq")


def _rope_from_params(raw: Mapping[str, Any], params: dict[str, Any], source: str) -> RopeConfig:
    """One RopeConfig from a rope-parameters dict read from the config.json field `source`.

    Defaults follow transformers' `standardize_rope_params` and rope init functions: scaled
    types without `original_max_position_embeddings` use max_position_embeddings (a top-level
    `original_max_position_embeddings`, as phi3 has, takes precedence), and longrope or yarn
    without `factor` use max_position_embeddings / original_max_position_embeddings.
    rope_theta and partial_rotary_factor absent from `params` come from the top level.
    """

    def number(key: str, default: Any = None, *, positive: bool = False, top_level: bool = False):
        if top_level and params.get(key) is None:
            return fields.number(raw.get(key), key, default, positive=positive)
        return fields.number(params.get(key), f"{source}.{key}", default, positive=positive)

    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "su":  # phi3's early name for longrope
        rope_type = "longrope"
    if rope_type == "mrope":  # Qwen2-VL's name for default frequencies over 3-D positions
        rope_type = "default"
    if rope_type not in ROPE_TYPES:
        raise ConfigError(
            f"config.json: rope type {rope_type!r} is not supported; accepted: {list(ROPE_TYPES)}"
        )
    missing = [key for key in _ROPE_REQUIRED_KEYS.get(rope_type, ()) if params.get(key) is None]
    if missing:
        raise ConfigError(
            f"config.json: field '{source}.{missing[0]}' is required for {rope_type!r} rope "
            "scaling and missing"
        )
    key = "original_max_position_embeddings"
    original = fields.integer(raw.get(key), key) or fields.integer(
        params.get(key), f"{source}.{key}"
    )
    if original is None and rope_type in _ROPE_TYPES_WITH_ORIGINAL:
        original = raw["max_position_embeddings"]
    factor = number("factor")
    if factor is None and rope_type in ("longrope", "yarn") and original:
        factor = raw["max_position_embeddings"] / original
    return RopeConfig(
        theta=number("rope_theta", 10000.0, positive=True, top_level=True),
        type=rope_type,
        factor=factor if factor is not None else 1.0,
        original_max_position_embeddings=original,
        low_freq_factor=number("low_freq_factor", 1.0, positive=True),
        high_freq_factor=number("high_freq_factor", 4.0, positive=True),
        beta_fast=number("beta_fast") or 32.0,
        beta_slow=number("beta_slow") or 1.0,
        attention_factor=number("attention_factor"),
        mscale=number("mscale"),
        mscale_all_dim=number("mscale_all_dim"),
        truncate=fields.flag(params.get("truncate"), f"{source}.truncate", True),
        short_factor=fields.float_tuple(params.get("short_factor"), f"{source}.short_factor"),
        long_factor=fields.float_tuple(params.get("long_factor"), f"{source}.long_factor"),
        short_mscale=number("short_mscale", positive=True),
        long_mscale=number("long_mscale", positive=True),
        partial_rotary_factor=number("partial_rotary_factor", 1.0, top_level=True),
        mrope_section=(
            fields.int_tuple(params["mrope_section"], f"{source}.mrope_section")
            if params.get("mrope_section") is not None
            else None
        ),
        frequency_factors=fields.float_tuple(
            params.get("frequency_factors"), f"{source}.frequency_factors"
        ),
    )


def validate_rope(rope: RopeConfig, head_dim: int) -> None:
    """Refuse a rope whose tables cannot be built: too few rotated channels, a scaling factor
    that is not positive, longrope factor lists that do not match the rotated channel pairs."""
    rotary_dim = rotated_channels(head_dim, rope.partial_rotary_factor)
    if rotary_dim < 2 or not 0.0 < rope.partial_rotary_factor <= 1.0:
        raise ConfigError(
            f"config.json: partial_rotary_factor {rope.partial_rotary_factor} must be in "
            "(0, 1] and leave at least two rotated channels"
        )
    if rope.mrope_section is not None and (
        sum(rope.mrope_section) != rotary_dim // 2 or min(rope.mrope_section) < 1
    ):
        raise ConfigError(
            f"config.json: mrope_section {list(rope.mrope_section)} must be positive channel "
            f"pair counts summing to half the rotated channels ({rotary_dim // 2})"
        )
    if rope.mrope_section is not None and rope.type == "longrope":
        raise ConfigError(
            "config.json: mrope_section with 'longrope' scaling is not supported; accepted: "
            "mrope with one set of frequencies (default, linear, dynamic, llama3, yarn)"
        )
    if rope.type in ("linear", "dynamic", "llama3", "yarn") and rope.factor <= 0:
        raise ConfigError(
            f"config.json: rope factor must be positive for {rope.type!r} scaling, "
            f"found {rope.factor}"
        )
    pairs = (rotary_dim - rotary_dim % 2) // 2
    factors = rope.frequency_factors
    if factors is not None and (len(factors) != pairs or min(factors) <= 0):
        raise ConfigError(
            f"config.json: rope frequency_factors has {len(factors)} entries, smallest "
            f"{min(factors, default=0)}; accepted: one positive factor per rotated channel "
            f"pair ({pairs})"
        )
    if rope.type == "longrope":
        if rope.short_factor is None or rope.long_factor is None:
            raise ConfigError(
                "config.json: longrope scaling needs both 'short_factor' and 'long_factor'"
            )
        for name in ("short_factor", "long_factor"):
            if len(getattr(rope, name)) != pairs:
                raise ConfigError(
                    f"config.json: longrope {name} has {len(getattr(rope, name))} entries; "
                    f"accepted: one per rotated channel pair ({pairs})"
                )
