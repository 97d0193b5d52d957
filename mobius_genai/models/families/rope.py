"""Rope quirks: families whose rotary embedding config.json does not describe the usual way
(a local rope of its own, NTK-alpha scaling, GPT-J's rotary_dim)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import RopeConfig, fields
from mobius_genai.config.rope import parse_rope
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models.families.heads import split_hidden


def olmo3_rope_local(raw: Mapping[str, Any]) -> RopeConfig | None:
    """Olmo3's sliding layers rotate without the rope scaling of its full-attention layers:
    default rope with the theta of `rope_parameters.sliding_attention`, else 500000.

    Without per-layer-type rope parameters, transformers 5 rotates sliding layers with
    Olmo3Config's default theta 500000 whatever rope_theta says, transformers 4 with rope_theta;
    a rope_theta other than 500000 is ambiguous there and refused."""
    rope, local = parse_rope(raw)
    if rope.type == "longrope":
        raise UnsupportedModelError(
            "config.json: rope_scaling (rope_parameters) of type 'longrope' is not supported for "
            "olmo3 models"
        )
    if local is None:
        theta = fields.number(raw.get("rope_theta"), "rope_theta", 500_000.0, positive=True)
        if theta != 500_000.0:
            raise UnsupportedModelError(
                f"config.json: rope_theta is {theta!r} and rope_parameters has no "
                "'sliding_attention' entry; olmo3's sliding layers then rotate with 500000 in "
                "transformers 5 but with rope_theta in transformers 4, so the model is refused: "
                "give rope_parameters per layer type"
            )
        local = RopeConfig(theta=theta)
    return None if local == rope else local


def ntk_alpha_rope(raw: Mapping[str, Any]) -> RopeConfig:
    """Hunyuan's rope: "dynamic" with a fixed `alpha` is NTK-alpha rope, a default rope whose
    base is rope_theta * alpha ** (head_dim / (head_dim - 2)) (transformers' ntk_alpha)."""
    rope, _ = parse_rope(raw)
    params = {**fields.mapping(raw.get("rope_parameters"), "rope_parameters")}
    params.update(fields.mapping(raw.get("rope_scaling"), "rope_scaling"))
    alpha = params.get("alpha")
    if rope.type != "dynamic" or not alpha:
        return rope
    alpha = fields.number(alpha, "rope_scaling.alpha", positive=True)
    heads = fields.require(raw, "num_attention_heads")
    dim = (
        fields.integer(raw.get("head_dim"), "head_dim")
        or fields.require(raw, "hidden_size") // heads
    )
    return RopeConfig(theta=rope.theta * alpha ** (dim / (dim - 2)))


def gptj_partial_rotary(raw: Mapping[str, Any]) -> float:
    """GPT-J rotates the first `rotary_dim` channels of each head (GPTJConfig: 64 when absent;
    null rotates the whole head)."""
    head_dim = split_hidden(raw)
    rotary_dim = fields.integer(raw.get("rotary_dim", 64), "rotary_dim", head_dim)
    if rotary_dim > head_dim or rotary_dim % 2:
        raise ConfigError(
            f"config.json: field 'rotary_dim' must be an even number of channels at most the "
            f"head size {head_dim}, found {rotary_dim!r}"
        )
    factor = rotary_dim / head_dim
    while int(head_dim * factor) < rotary_dim:  # r / h * h can land just below r
        factor = math.nextafter(factor, math.inf)
    return factor


def gptj_rope(raw: Mapping[str, Any]) -> RopeConfig:
    """GPTJRotaryEmbedding's fixed sinusoids (base 10000) whatever rope_theta says; rope scaling,
    which it ignores too, is refused in either spelling (transformers 5 writes rope_scaling
    as rope_parameters)."""
    rope, _ = parse_rope(raw)
    if rope.type != "default":
        raise UnsupportedModelError(
            f"config.json: rope_scaling (rope_parameters) of type {rope.type!r}; gptj models "
            "are supported only without rope scaling, which GPTJRotaryEmbedding ignores"
        )
    return RopeConfig(partial_rotary_factor=rope.partial_rotary_factor)


# ApertusConfig's rope when config.json names none
_APERTUS_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 12_000_000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}


def apertus_rope(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """ApertusConfig's llama3 rope for a config.json without rope_theta or rope_scaling
    (a default for `rope_parameters`); None where the hub layout gives them."""
    if raw.get("rope_theta") is not None or raw.get("rope_scaling") is not None:
        return None
    return dict(_APERTUS_ROPE)


def layer_rope_thetas(raw: Mapping[str, Any]) -> tuple[float, ...]:
    """granite_swa's `layer_rope_theta`: each layer's rope base (0: no rotary in that layer);
    absent, null or rope_theta in every layer, an empty tuple (each layer on the rope's own)."""
    thetas = raw.get("layer_rope_theta")
    if thetas is None:
        return ()
    if not isinstance(thetas, list | tuple):
        raise ConfigError(
            f"config.json: field 'layer_rope_theta' must be a list of one rope base per layer, "
            f"found {thetas!r}"
        )
    rope, _ = parse_rope(raw)
    return () if all(theta == rope.theta for theta in thetas) else tuple(thetas)
