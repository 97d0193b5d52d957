"""Llama 4's attention switches: chunked local layers that rotate, global layers that do not;
and the position-dependent query scale Llama 4 and Ministral 3 share.

Layers of type "chunked_attention" let a query see only the keys of its own chunk of
`chunk_size` positions (transformers' chunked causal mask: key j is visible to query i when
j <= i and j // chunk_size == i // chunk_size, counted from a row's first token). The other
layers attend to the whole context without a rotary embedding (NoPE). With `qk_l2_norm` the
rotating layers normalize each q and k head after the rotation by a weightless RMS norm
(transformers' Llama4TextL2Norm); with `temperature` the NoPE layers multiply each query by
log1p(floor((position + 1) / floor_scale)) * scale + 1 (attention temperature tuning,
arXiv 2501.19399). Ministral 3 (transformers' get_llama_4_attn_scale) scales the queries of
every layer by log1p(floor(position / original_max_position_embeddings)) * beta + 1: the same
factor with no offset, after the rotation, in a model with neither chunked nor NoPE layers.
"""

from __future__ import annotations

import dataclasses

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError

#: The layer type of chunked local attention (config/layers.py's attention layer kinds).
CHUNKED = "chunked_attention"


@dataclasses.dataclass(frozen=True)
class TemperatureTuning:
    """Each query times log1p(floor((position + position_offset) / floor_scale)) * scale + 1,
    in the NoPE layers (Llama 4's, offset 1) or, with `every_layer`, in all (Ministral 3's,
    offset 0)."""

    floor_scale: float
    scale: float
    position_offset: int = 1
    every_layer: bool = False


@dataclasses.dataclass(frozen=True)
class LocalGlobalAttention:
    """Chunked local layers, NoPE global layers, the query scale (see the module docstring)."""

    chunk_size: int | None
    qk_l2_norm: bool = False
    temperature: TemperatureTuning | None = None


def validate_local_global(
    section: LocalGlobalAttention | None, layer_types: tuple[str, ...]
) -> None:
    """Chunked layers need a positive chunk size; temperature factors are positive numbers."""
    chunked = CHUNKED in layer_types
    if section is None:
        if chunked:
            raise ConfigError(
                f"config.json: layer_types holds {CHUNKED!r}, which only the families that read "
                "attention_chunk_size build"
            )
        return
    if not isinstance(section, LocalGlobalAttention):
        raise ConfigError(
            f"config.json: local_global must be a LocalGlobalAttention, found {section!r}"
        )
    size = section.chunk_size
    if chunked and (not fields.is_int(size) or size <= 0):
        raise ConfigError(
            f"config.json: attention_chunk_size must be a positive integer for {CHUNKED} "
            f"layers, found {size!r}"
        )
    tuning = section.temperature
    if tuning is not None and not all(
        fields.is_number(value) and value > 0 for value in (tuning.floor_scale, tuning.scale)
    ):
        raise ConfigError(
            f"config.json: floor_scale {tuning.floor_scale!r} and attn_scale {tuning.scale!r}; "
            "accepted: positive numbers"
        )
