"""Gemma 3n's decoder (`gemma3n_text`): several hidden streams (AltUp), a per-layer input
table, Laurel blocks, sparse first MLPs and layers that attend over an earlier layer's cache.

- AltUp: `streams` copies of the hidden state; each layer predicts all of them from the
  `active` one, runs attention and MLP on the active prediction, then corrects every stream by
  the innovation (components/altup.py).
- Per-layer inputs: a second embedding table [per_layer_vocab, layers * per_layer_size] plus a
  projection of the token embedding, one [per_layer_size] slice per layer.
- Laurel: a rank-`laurel_rank` residual beside attention.
- `activation_sparsity[i]` > 0: layer i's MLP keeps only gate activations above
  mean + std * Φ⁻¹(sparsity) (a Gaussian top-k).
- `kv_sources[i]`: the layer whose keys and values layer i attends over; a shared layer
  (the last `num_kv_shared_layers`) reads the last unshared layer of its attention type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.layers import parse_layer_types
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class AltUpConfig:
    """Gemma 3n's per-layer sizes and switches (see the module docstring)."""

    streams: int
    active: int
    correct_scale: bool
    laurel_rank: int
    per_layer_size: int
    per_layer_vocab: int
    # the checkpoint's layer count: the per-layer table holds a slice for each, in a twin too
    table_layers: int
    intermediate_sizes: tuple[int, ...]
    activation_sparsity: tuple[float, ...]
    kv_sources: tuple[int, ...]

    def first_layers(self, count: int) -> AltUpConfig:
        """The section of the first `count` layers (a layer's source is never after it)."""
        return dataclasses.replace(
            self,
            intermediate_sizes=self.intermediate_sizes[:count],
            activation_sparsity=self.activation_sparsity[:count],
            kv_sources=self.kv_sources[:count],
        )


def _per_layer(raw: Mapping[str, Any], key: str, layers: int, default: Any) -> tuple:
    value = raw.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, Sequence) or isinstance(value, str):
        return (value,) * layers
    if len(value) != layers:
        raise ConfigError(
            f"config.json: {key} has {len(value)} values for {layers} layers; accepted: one "
            "value, or one per layer"
        )
    return tuple(value)


def kv_sources(layer_types: Sequence[str], shared: int) -> tuple[int, ...]:
    """Layer i's cache source: itself, or for the last `shared` layers the last unshared layer
    of the same attention type (transformers' kv_sharing_modes)."""
    first_shared = len(layer_types) - shared
    if shared and not 0 < first_shared <= len(layer_types):
        raise ConfigError(
            f"config.json: num_kv_shared_layers {shared} leaves no layer to share from; "
            f"accepted: 0 to {len(layer_types) - 1}"
        )
    last = {kind: i for i, kind in enumerate(layer_types[:first_shared])}
    sources = []
    for i, kind in enumerate(layer_types):
        if i < first_shared:
            sources.append(i)
        elif kind not in last:
            raise ConfigError(
                f"config.json: shared layer {i} is {kind!r} but no earlier layer of that type "
                "has a cache; accepted: num_kv_shared_layers after a layer of every type"
            )
        else:
            sources.append(last[kind])
    return tuple(sources)


def altup_section(raw: Mapping[str, Any]) -> AltUpConfig:
    """The AltUpConfig of a gemma3n_text config.json (transformers' Gemma3nTextConfig
    defaults for absent keys)."""
    layers = fields.require(raw, "num_hidden_layers")
    streams = fields.integer(raw.get("altup_num_inputs"), "altup_num_inputs", 4)
    active = fields.integer(raw.get("altup_active_idx"), "altup_active_idx", 0, positive=False)
    if not 0 <= active < streams:
        raise ConfigError(
            f"config.json: altup_active_idx {active} is not a stream of {streams}; accepted: "
            f"0 to {streams - 1}"
        )
    sparse_default = [0.95] * 10 + [0.0] * (layers - 10) if layers > 10 else [0.0] * layers
    sparsity = _per_layer(raw, "activation_sparsity_pattern", layers, sparse_default)
    if any(not fields.is_number(s) or not 0.0 <= s < 1.0 for s in sparsity):
        raise ConfigError(
            f"config.json: activation_sparsity_pattern {list(sparsity)} holds a value outside "
            "[0, 1); accepted: fractions in [0, 1)"
        )
    return AltUpConfig(
        streams=streams,
        active=active,
        correct_scale=fields.flag(raw.get("altup_correct_scale"), "altup_correct_scale", True),
        laurel_rank=fields.integer(raw.get("laurel_rank"), "laurel_rank", 64),
        per_layer_size=fields.integer(
            raw.get("hidden_size_per_layer_input"), "hidden_size_per_layer_input", 256
        ),
        per_layer_vocab=fields.integer(
            raw.get("vocab_size_per_layer_input"), "vocab_size_per_layer_input", 262_144
        ),
        table_layers=layers,
        intermediate_sizes=tuple(
            fields.integer(size, "intermediate_size")
            for size in _per_layer(raw, "intermediate_size", layers, None)
        ),
        activation_sparsity=tuple(float(s) for s in sparsity),
        kv_sources=kv_sources(
            parse_layer_types(raw, layers),
            fields.integer(
                raw.get("num_kv_shared_layers"), "num_kv_shared_layers", 0, positive=False
            ),
        ),
    )
