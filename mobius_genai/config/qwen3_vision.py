"""Qwen3-VL's vision tower: its sizes, its learned position grid and its DeepStack layers.

Images arrive as Qwen2.5-VL's do (flattened patches in merge-block order and their grid
(t, h, w)); patches add a learned position embedding resampled from a square grid of
`num_position_embeddings` to each image's grid, every block attends within one frame, and the
blocks in `deepstack_visual_indexes` also feed a merger of their own whose tokens the text
decoder adds to its first hidden states (DeepStack).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.layers import check_layer_count, first_of_every_kind
from mobius_genai.config.qwen_vision import QwenTower, check_heads, tower_fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Qwen3VisionConfig(QwenTower):
    """transformers' Qwen3VLVisionConfig, the keys the graph reads."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6  # transformers fixes it for the blocks' and the mergers' LayerNorms
    # og reads it for videos' temporal positions; transformers' Qwen3-VL uses timestamps
    tokens_per_second: float = 2.0

    @property
    def grid_side(self) -> int:
        """Side of the square learned position grid."""
        return math.isqrt(self.num_position_embeddings)

    @property
    def deepstack_mergers(self) -> int:
        """The DeepStack mergers the tower computes: those of the blocks it has (all but in a
        twin cut to its first blocks, whose missing blocks' features are zeros)."""
        return sum(index < self.depth for index in self.deepstack_visual_indexes)

    def layers_of_every_kind(self) -> int:
        """The fewest first blocks with a DeepStack block and a plain one, where it has both."""
        return first_of_every_kind(
            [index in self.deepstack_visual_indexes for index in range(self.depth)]
        )

    def first_layers(self, count: int) -> Qwen3VisionConfig:
        """The same tower with only its first `count` blocks. The DeepStack indexes stay, so
        the features keep their width (the bundle's contract): those of dropped blocks are
        zeros, and a twin's decoder of fewer layers than DeepStack parts never adds them."""
        check_layer_count(count, self.depth, "vision layer count")
        return dataclasses.replace(self, depth=count)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Qwen3VisionConfig:
        """Parse `vision_config` (transformers' defaults where absent)."""
        defaults = cls()
        key = "deepstack_visual_indexes"
        indexes = fields.int_tuple(raw.get(key), f"vision_config.{key}") if key in raw else None
        config = cls(
            **tower_fields(raw, defaults, ("num_position_embeddings",)),
            deepstack_visual_indexes=defaults.deepstack_visual_indexes
            if indexes is None
            else indexes,
        )
        check_heads(config)
        _check(config)
        return config


def _check(config: Qwen3VisionConfig) -> None:
    if config.grid_side**2 != config.num_position_embeddings:
        raise ConfigError(
            f"config.json: vision_config.num_position_embeddings "
            f"{config.num_position_embeddings} is not a square (a side x side learned grid)"
        )
    indexes = list(config.deepstack_visual_indexes)
    if indexes != sorted(set(indexes)) or not all(0 <= i < config.depth for i in indexes):
        raise ConfigError(
            f"config.json: vision_config.deepstack_visual_indexes {indexes}: accepted: "
            f"increasing block indexes in 0..{config.depth - 1}"
        )
