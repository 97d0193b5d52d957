"""Attention layers whose heads differ from the cache's one layout (MiMo-V2-Flash).

onnxruntime-genai 0.18 keeps one head size and one key/value head count for every layer's
cache. MiMo-V2-Flash's values are narrower than its keys (`v_head_dim` < `head_dim`) and are
scaled by `attention_value_scale`; its full-attention layers project half the key/value heads
of its sliding ones, which alone have attention sinks. The graph keeps the checkpoint's
projections and, per layer: scales the values and pads each value head with zeros up to
`head_dim` (the padded channels of the output are zeros, sliced off before o_proj); repeats
each key/value head `num_key_value_heads / kv_heads[layer]` times in a row, so query head h
still reads the group it read (h // (heads / kv_heads)). The cache holds the widest layout.
"""

from __future__ import annotations

import dataclasses

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class HeadLayout:
    """Each layer's stored heads, widened to the cache's (see the module docstring)."""

    v_head_dim: int
    value_scale: float = 1.0
    # the key/value heads each layer projects (a divisor of num_key_value_heads)
    kv_heads: tuple[int, ...] = ()
    # the layer types whose attention has sinks (with ArchitectureConfig.attention_sinks)
    sink_layer_types: tuple[str, ...] = ()

    def first_layers(self, count: int) -> HeadLayout:
        return dataclasses.replace(self, kv_heads=self.kv_heads[:count])


def validate_head_layout(
    layout: HeadLayout | None, head_dim: int, kv_heads: int, num_layers: int
) -> None:
    """Refuse a layout the cache cannot hold: values wider than keys, head counts that do not
    divide the cache's."""
    if layout is None:
        return
    v_dim = layout.v_head_dim
    if not (fields.is_int(v_dim) and 0 < v_dim <= head_dim):
        raise ConfigError(
            f"config.json: v_head_dim is {v_dim!r}; accepted: a positive integer at most "
            f"head_dim ({head_dim})"
        )
    if not (fields.is_number(layout.value_scale) and layout.value_scale > 0):
        raise ConfigError(
            f"config.json: attention_value_scale is {layout.value_scale!r}; accepted: a "
            "positive number"
        )
    counts = layout.kv_heads
    if len(counts) != num_layers or any(
        not fields.is_int(c) or c <= 0 or kv_heads % c for c in counts
    ):
        raise ConfigError(
            f"config.json: per-layer key/value heads {list(counts)!r}; accepted: one divisor "
            f"of {kv_heads} per layer ({num_layers})"
        )
