"""Cohere's North decoder (cohere_compass_text, CohereCompassForCausalLM): cohere2's parallel
block (one bias-free LayerNorm feeding attention and MLP) with a rope of its own per layer type.

`rope_parameters` holds one entry per layer type ("full_attention", "sliding_attention"); a
null entry leaves that type's layers unrotated. The entries may carry Qwen3-VL's
`mrope_section`: a text prompt's positions are the same on every axis, so the rotation is the
ordinary one over halves (rotate_half) and the sections change nothing. The logits are
multiplied by `logit_scale`, 1 when null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.rope import RopeConfig, parse_rope
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.heads import hidden_over_heads

_LAYER_TYPES = ("full_attention", "sliding_attention")
#: Qwen3-VL's position sections, which text positions leave without effect
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def _rope_entries(raw: Mapping[str, Any]) -> dict[str, Any]:
    """rope_parameters by layer type (a type absent or null: unrotated layers)."""
    params = fields.mapping(raw.get("rope_parameters"), "rope_parameters")
    if not params or not set(params) <= set(_LAYER_TYPES):
        raise UnsupportedModelError(
            f"config.json: rope_parameters is {params!r}; cohere_compass_text models are "
            f"supported with one entry (or null) per layer type, keys {list(_LAYER_TYPES)}"
        )
    return {
        key: None
        if params.get(key) is None
        else {k: v for k, v in params[key].items() if k not in _MROPE_KEYS}
        for key in _LAYER_TYPES
    }


def _ropes(raw: Mapping[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    entries = {key: entry or {} for key, entry in _rope_entries(raw).items()}
    return parse_rope({**raw, "rope_parameters": entries})


def _no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """The layers whose type has a null rope entry."""
    entries = _rope_entries(raw)
    types = raw["layer_types"]  # the row's default fills it in
    if not isinstance(types, list | tuple):
        return ()  # layer parsing refuses it with its own message
    return tuple(i for i, kind in enumerate(types) if entries.get(kind) is None)


def _logits_scaling(raw: Mapping[str, Any]) -> float:
    """The graph divides by the inverse of logit_scale (1 when null)."""
    return 1.0 / fields.number(raw.get("logit_scale"), "logit_scale", 1.0, positive=True)


COHERE_COMPASS_TEXT = FamilyAdapter(
    model_type="cohere_compass_text",
    config_defaults={
        "tie_word_embeddings": True,
        "layer_norm_eps": 1e-5,
        "sliding_window": lambda raw: None if "sliding_window" in raw else 4096,
        "layer_types": lambda raw: ["full_attention"] * fields.require(raw, "num_hidden_layers"),
    },
    config_overrides={
        "norm_type": "layer_no_bias",
        "parallel_residual": True,  # one shared norm (input_layernorm)
        "mlp_bias": False,
        "head_dim": hidden_over_heads,
        "logits_scaling": _logits_scaling,
        "rope": lambda raw: _ropes(raw)[0],
        "rope_local": lambda raw: _ropes(raw)[1],
        "no_rope_layers": _no_rope_layers,
    },
)
