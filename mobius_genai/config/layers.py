"""Layer kinds: which layers attend to the whole context, which to a sliding window, which
carry a fixed-size recurrent state instead of a KV cache (the blocks of config/recurrent.py),
and which are an MLP alone (Nemotron-H's "mlp" layers: no token mixer, no cache)."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from mobius_genai.config import fields
from mobius_genai.config.local_global import CHUNKED
from mobius_genai.config.recurrent import RECURRENT_BLOCKS
from mobius_genai.errors import ConfigError

if TYPE_CHECKING:
    from mobius_genai.config.architecture import ArchitectureConfig

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", CHUNKED)
#: A layer that is its MLP alone, with no token mixer and no cache (ArchitectureConfig's
#: `one_block_layers`).
MLP_LAYER_TYPE = "mlp"


def known_layer_types() -> tuple[str, ...]:
    """Every layer kind a decoder can build: attention, each registered recurrent block and
    an MLP alone."""
    return ATTENTION_LAYER_TYPES + tuple(RECURRENT_BLOCKS) + (MLP_LAYER_TYPE,)


#: The built-in layer kinds: attention, those with a recurrent state (config/recurrent.py) and
#: an MLP alone.
LAYER_TYPES = known_layer_types()


def first_of_every_kind(kinds: Sequence[Hashable]) -> int:
    """The fewest first layers that hold every kind in `kinds` (each layer's kind, in order):
    a model cut to them builds, and runs, every kind of layer of the whole one."""
    missing = set(kinds)
    for count, kind in enumerate(kinds, 1):
        missing.discard(kind)
        if not missing:
            return count
    return len(kinds)


def check_layer_count(count: int, total: int, what: str = "layer count") -> None:
    """Raise ConfigError unless `count` is a whole number of layers in 1..`total` (a first-layers
    cut, the smoke test's twin)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{what} must be a positive integer, found {count!r}")
    if count > total:
        raise ConfigError(
            f"{what} {count} is above the model's {total} layers; accepted: 1..{total}"
        )


class UniformTower:
    """An encoder tower (a frozen dataclass with `num_hidden_layers`) whose layers are all
    alike: one layer holds every kind, and a first-layers cut is the same tower, shorter."""

    num_hidden_layers: int

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    def layers_of_every_kind(self) -> int:
        """1: every encoder layer is alike (the smoke test's twin keeps the first)."""
        return 1

    def first_layers(self, count: int) -> Self:
        """The same tower with only its first `count` encoder layers."""
        check_layer_count(count, self.num_hidden_layers, "vision layer count")
        return dataclasses.replace(self, num_hidden_layers=count)


def parse_layer_types(raw: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """The kind of each layer: config.json's `layer_types`; else, with a `sliding_window`, all
    sliding, or, where the row keeps use_sliding_window, sliding from `max_window_layers` on
    (Qwen2Config's and Qwen3Config's rule; 28 when absent, their default); else full."""
    if not fields.flag(raw.get("use_sliding_window"), "use_sliding_window", True):
        # transformers drops the window when use_sliding_window is off, whatever layer_types say
        return ("full_attention",) * num_layers
    layer_types = raw.get("layer_types")
    if layer_types is not None and not isinstance(layer_types, list | tuple):
        raise ConfigError(
            f"config.json: field 'layer_types' must be a list, found {layer_types!r}; accepted: "
            f"one of {list(known_layer_types())} per layer"
        )
    if layer_types:
        return tuple(layer_types)
    if raw.get("sliding_window") is None:
        return ("full_attention",) * num_layers
    first_sliding = 0
    if "use_sliding_window" in raw:
        first_sliding = fields.integer(
            raw.get("max_window_layers"), "max_window_layers", 28, positive=False
        )
    return tuple(
        "sliding_attention" if i >= first_sliding else "full_attention" for i in range(num_layers)
    )


def check_one_type_per_layer(layer_types: Sequence[str], num_layers: int) -> None:
    """Raise ConfigError unless `layer_types` has one entry per layer (before anything indexes
    it by layer)."""
    if len(layer_types) != num_layers:
        raise ConfigError(
            f"config.json: layer_types has {len(layer_types)} entries for {num_layers} layers; "
            "accepted: one entry per layer"
        )


def validate_layers(config: ArchitectureConfig) -> None:
    """One known kind per layer, a window for sliding layers, no-rope indices that exist, a
    rope base per layer where the config gives them."""
    check_one_type_per_layer(config.layer_types, config.num_hidden_layers)
    unknown = [kind for kind in config.layer_types if kind not in known_layer_types()]
    if unknown:
        raise ConfigError(
            f"config.json: layer_types holds {unknown}; accepted: {list(known_layer_types())}"
        )
    if "sliding_attention" in config.layer_types and (
        not fields.is_int(config.sliding_window) or config.sliding_window <= 0
    ):
        raise ConfigError(
            f"config.json: sliding_window must be a positive integer for sliding layers, "
            f"found {config.sliding_window!r}"
        )
    for kind in dict.fromkeys(config.layer_types):
        block = RECURRENT_BLOCKS.get(kind)
        if block is not None and getattr(config, block.section, None) is None:
            raise ConfigError(
                f"config.json: model_type {config.model_type!r} has {kind} layers, which only "
                f"the families that read their {block.section} settings build"
            )
    _validate_block_layout(config)
    outside = [i for i in config.no_rope_layers if not 0 <= i < config.num_hidden_layers]
    if outside:
        raise ConfigError(
            f"config.json: no_rope_layers holds {outside}; accepted: layer indices 0.."
            f"{config.num_hidden_layers - 1}"
        )
    thetas = config.layer_rope_thetas
    if thetas and (
        len(thetas) != config.num_hidden_layers
        or any(not fields.is_number(theta) or theta < 0 for theta in thetas)
    ):
        raise ConfigError(
            f"config.json: layer_rope_theta must hold one rope base per layer "
            f"({config.num_hidden_layers}), each positive or 0 for none, found {list(thetas)!r}"
        )


def _validate_block_layout(config: ArchitectureConfig) -> None:
    """MLP-only layers only where each layer is one block; a recurrent block beside attention
    only one the config has the settings of."""
    if MLP_LAYER_TYPE in config.layer_types and not config.one_block_layers:
        raise ConfigError(
            f"config.json: model_type {config.model_type!r} has {MLP_LAYER_TYPE!r} layers, which "
            "only the families whose layers hold one block each build (nemotron_h)"
        )
    beside = config.parallel_recurrent
    if beside is None:
        return
    block = RECURRENT_BLOCKS.get(beside)
    if block is None or getattr(config, block.section, None) is None:
        raise ConfigError(
            f"config.json: a recurrent block {beside!r} beside attention needs its settings; "
            f"accepted: one of {list(RECURRENT_BLOCKS)} whose section the family reads"
        )
