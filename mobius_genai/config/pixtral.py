"""Mistral 3's vision side: the Pixtral tower's sizes and the projector that merges its patches.

Images keep their own size (a multiple of `patch_size * spatial_merge_size` pixels on each
side); every patch is a token of the tower, rotated by its (row, column) in the image, and
`spatial_merge_size`² neighbouring patches become one image token of the text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.architecture import ArchitectureConfig, activation
from mobius_genai.config.layers import UniformTower
from mobius_genai.config.rope import axial_rope_parameters
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class PixtralVisionConfig(UniformTower):
    """transformers' PixtralVisionConfig and Mistral3Config's projector keys, those the graph
    reads (defaults: Mistral-Small-3.1's)."""

    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_channels: int = 3
    patch_size: int = 14
    image_size: int = 1540
    hidden_act: str = "gelu"
    rope_theta: float = 10000.0
    spatial_merge_size: int = 2
    projector_hidden_act: str = "gelu"
    projector_bias: bool = False
    text_hidden_size: int = 5120
    projector_norm_eps: float = 1e-5  # the text config's rms_norm_eps (transformers' choice)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def merged_patch(self) -> int:
        """Pixels on a side of one image token (og's patch_size * spatial_merge_size)."""
        return self.patch_size * self.spatial_merge_size

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], text: ArchitectureConfig) -> PixtralVisionConfig:
        """Parse a Mistral 3 config.json (its `vision_config` and projector keys) whose text
        decoder is `text`."""
        vision = fields.mapping(raw.get("vision_config"), "vision_config")
        where = "vision_config."
        defaults = cls()
        sizes = {
            key: fields.integer(vision.get(key), where + key, getattr(defaults, key))
            for key in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_channels",
                "patch_size",
                "image_size",
            )
        }
        rope = axial_rope_parameters(vision, where, "Pixtral")
        layer = raw.get("vision_feature_layer", -1)
        if layer != -1:
            raise ConfigError(
                f"config.json: field 'vision_feature_layer' is {layer!r}; accepted: -1 (the "
                "tower's last layer, as Mistral 3 checkpoints use)"
            )
        config = cls(
            **sizes,
            hidden_act=activation(
                vision.get("hidden_act", defaults.hidden_act), where + "hidden_act"
            ),
            rope_theta=fields.number(
                rope.get("rope_theta", vision.get("rope_theta")),
                where + "rope_parameters.rope_theta",
                defaults.rope_theta,
                positive=True,
            ),
            spatial_merge_size=fields.integer(
                raw.get("spatial_merge_size"), "spatial_merge_size", defaults.spatial_merge_size
            ),
            projector_hidden_act=activation(
                raw.get("projector_hidden_act", defaults.projector_hidden_act),
                "projector_hidden_act",
            ),
            projector_bias=fields.flag(
                raw.get("multimodal_projector_bias"), "multimodal_projector_bias", False
            ),
            text_hidden_size=text.hidden_size,
            projector_norm_eps=text.norm_eps,
        )
        if config.hidden_size % config.num_attention_heads or config.head_dim % 4:
            raise ConfigError(
                f"config.json: vision_config.hidden_size {config.hidden_size} over "
                f"num_attention_heads {config.num_attention_heads} must be a whole head size "
                "divisible by 4 (2-D rotary halves)"
            )
        return config
