"""Qwen2.5-VL's and Qwen2-VL's vision towers: their sizes and how patches become image tokens.

Images arrive as flattened patches (the processor cuts each frame pair into
`temporal_patch_size` x `patch_size`² x channels values, merge-block order) with their grid
(t, h, w) in patches; `spatial_merge_size`² neighbouring patches become one image token.
Qwen2.5-VL's blocks attend within windows of `window_size` pixels, those in
`fullatt_block_indexes` within the whole frame; Qwen2-VL's (`Qwen2VisionConfig`) all attend
within the frame, with LayerNorms and an fc1 → act → fc2 MLP where Qwen2.5-VL has RMSNorms and
SwiGLU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.architecture import activation
from mobius_genai.config.layers import check_layer_count, first_of_every_kind
from mobius_genai.errors import ConfigError


class QwenTower:
    """The sizes a Qwen tower (Qwen2.5-VL's, Qwen3-VL's) derives from its config fields."""

    depth: int
    hidden_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values of one flattened patch (a pixel_values row)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def num_layers(self) -> int:
        return self.depth


@dataclasses.dataclass(frozen=True)
class QwenVisionConfig(QwenTower):
    """transformers' Qwen2_5_VLVisionConfig, the keys the graph reads."""

    depth: int = 32
    hidden_size: int = 3584
    intermediate_size: int = 3420
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    # None: no windows, every block attends within its frame (Qwen2-VL)
    window_size: int | None = 112
    out_hidden_size: int = 3584
    tokens_per_second: float = 4.0
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6  # transformers fixes it for the blocks' and the merger's norms
    # the blocks' and the merger's norms (components/norms.make_norm): Qwen2-VL's are "layer"
    norm_type: str = "rms"
    # SwiGLU (gate, up, down); False: fc1 → act → fc2 (Qwen2-VL's)
    gated_mlp: bool = True

    @property
    def window_tokens(self) -> int:
        """Side of a window in merged tokens (transformers' vit_merger_window_size)."""
        if self.window_size is None:
            raise ValueError("a tower without windows has no window side")
        return self.window_size // self.spatial_merge_size // self.patch_size

    def full_attention(self, index: int) -> bool:
        """Whether block `index` attends within the whole frame (not within a window)."""
        return self.window_size is None or index in self.fullatt_block_indexes

    def layers_of_every_kind(self) -> int:
        """The fewest first blocks with a windowed and a full-attention one, where the tower
        has both (`fullatt_block_indexes`)."""
        return first_of_every_kind([self.full_attention(index) for index in range(self.depth)])

    def first_layers(self, count: int) -> QwenVisionConfig:
        """The same tower with only its first `count` blocks."""
        check_layer_count(count, self.depth, "vision layer count")
        full = tuple(index for index in self.fullatt_block_indexes if index < count)
        return dataclasses.replace(self, depth=count, fullatt_block_indexes=full)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> QwenVisionConfig:
        """Parse `vision_config` (transformers' defaults where absent)."""
        where = "vision_config."
        defaults = cls()
        keys = ("window_size",)
        full = fields.int_tuple(raw.get("fullatt_block_indexes"), where + "fullatt_block_indexes")
        config = cls(
            **tower_fields(raw, defaults, keys),
            tokens_per_second=fields.number(
                raw.get("tokens_per_second"), where + "tokens_per_second", 4.0, positive=True
            ),
            fullatt_block_indexes=full
            if "fullatt_block_indexes" in raw
            else defaults.fullatt_block_indexes,
        )
        check_heads(config)
        if config.window_tokens < 1:
            raise ConfigError(
                f"config.json: vision_config.window_size {config.window_size} is smaller than "
                f"one merged token (spatial_merge_size * patch_size = "
                f"{config.spatial_merge_size * config.patch_size} pixels)"
            )
        return config


@dataclasses.dataclass(frozen=True)
class Qwen2VisionConfig(QwenVisionConfig):
    """transformers' Qwen2VLVisionConfig: Qwen2.5-VL's tower without windows, LayerNorms and an
    fc1 → quick_gelu → fc2 MLP; config.json names the tower's width `embed_dim`, the merger's
    output `hidden_size` and the MLP's width as `mlp_ratio` times the tower's."""

    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 5120
    num_heads: int = 16
    out_hidden_size: int = 3584
    window_size: int | None = None
    fullatt_block_indexes: tuple[int, ...] = ()
    hidden_act: str = "quick_gelu"
    norm_type: str = "layer"
    gated_mlp: bool = False
    # og's video positions step by tokens_per_second for each temporal patch (a second each by
    # default); Qwen2-VL's step by 1
    tokens_per_second: float = 1.0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Qwen2VisionConfig:
        """Parse `vision_config` (transformers' defaults where absent)."""
        defaults = cls()
        read = tower_fields(raw, defaults, (), _QWEN2_KEYS)
        ratio = fields.number(raw.get("mlp_ratio"), "vision_config.mlp_ratio", 4, positive=True)
        read["intermediate_size"] = int(read["hidden_size"] * ratio)
        config = cls(**read)
        check_heads(config)
        return config


#: Qwen2VLVisionConfig's names of the tower's fields, where they differ.
_QWEN2_KEYS = {
    "hidden_size": "embed_dim",
    "out_hidden_size": "hidden_size",
    "intermediate_size": None,
}

#: The integer keys of a Qwen tower's vision_config that Qwen2.5-VL and Qwen3-VL share.
_SHARED_SIZES = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "in_channels",
    "patch_size",
    "spatial_merge_size",
    "temporal_patch_size",
    "out_hidden_size",
)


def tower_fields(
    raw: Mapping[str, Any],
    defaults: Any,
    keys: tuple[str, ...],
    names: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """A Qwen tower's (Qwen2.5-VL's, Qwen3-VL's, Qwen2-VL's) sizes, `keys` besides, its
    hidden_act and its 2-D rope's theta from `vision_config`, the `defaults` config's values
    where absent; `names`: a field's key in `vision_config` where it differs (None: the
    defaults' value, the caller derives it)."""
    where = "vision_config."
    names = names or {}
    read = {}
    for field in _SHARED_SIZES + keys:
        key = names.get(field, field)
        value = None if key is None else raw.get(key)
        read[field] = fields.integer(value, where + str(key), getattr(defaults, field))
    act = activation(raw.get("hidden_act", defaults.hidden_act), where + "hidden_act")
    rope = fields.mapping(raw.get("rope_parameters"), where + "rope_parameters")
    theta = fields.number(
        rope.get("rope_theta", raw.get("rope_theta")),
        where + "rope_parameters.rope_theta",
        10000.0,
        positive=True,
    )
    return {**read, "hidden_act": act, "rope_theta": theta}


def check_heads(config: QwenTower) -> None:
    """A Qwen tower's heads: whole, and a head size its 2-D rotary halves split in pairs."""
    if config.hidden_size % config.num_heads or config.head_dim % 4:
        raise ConfigError(
            f"config.json: vision_config.hidden_size {config.hidden_size} over num_heads "
            f"{config.num_heads} must be a whole head size divisible by 4 (2-D rotary halves)"
        )
