"""LFM2-VL's vision side: a SigLIP2 NaFlex tower and the pixel-unshuffle projector, as data.

The NaFlex tower takes each image at its own size: patches of `patch_size` pixels (flattened
row by row, padded to the longest image's count and masked), learned positions on a square
grid of `num_patches` resized to the image's patch grid (bilinear, antialiased), pre-norm
encoder layers and a final LayerNorm. LFM2-VL's projector joins each `downsample_factor`²
block of patches into one token (pixel unshuffle), then LayerNorm, Linear, GELU, Linear.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.architecture import ArchitectureConfig, activation
from mobius_genai.config.layers import UniformTower
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class NaflexVisionConfig(UniformTower):
    """SigLIP2's NaFlex tower (Siglip2VisionConfig) and LFM2-VL's projector."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    patch_size: int
    num_patches: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"
    downsample_factor: int = 2
    projector_hidden_size: int = 2560
    projector_bias: bool = True
    projector_layernorm: bool = True
    projector_act: str = "gelu"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def position_grid(self) -> int:
        """Side of the square grid of learned positions."""
        return round(self.num_patches**0.5)

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: patch_size² pixels of num_channels."""
        return self.patch_size * self.patch_size * self.num_channels


_TOWER_DEFAULTS = (  # Siglip2VisionConfig's
    ("hidden_size", 768),
    ("intermediate_size", 3072),
    ("num_hidden_layers", 12),
    ("num_attention_heads", 12),
    ("num_channels", 3),
    ("num_patches", 256),
    ("patch_size", 16),
)


def _tower(raw: Mapping[str, Any]) -> dict[str, Any]:
    where = "vision_config."
    sizes = {
        key: fields.integer(raw.get(key), where + key, default) for key, default in _TOWER_DEFAULTS
    }
    if sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise ConfigError(
            f"config.json: vision_config.hidden_size {sizes['hidden_size']} is not a multiple "
            f"of vision_config.num_attention_heads {sizes['num_attention_heads']}"
        )
    grid = round(sizes["num_patches"] ** 0.5)
    if grid * grid != sizes["num_patches"]:
        raise ConfigError(
            f"config.json: vision_config.num_patches {sizes['num_patches']} is not a square "
            "(the learned positions form a square grid)"
        )
    return {
        **sizes,
        "layer_norm_eps": fields.number(
            raw.get("layer_norm_eps"), where + "layer_norm_eps", 1e-6, positive=True
        ),
        "hidden_act": activation(raw.get("hidden_act", "gelu_pytorch_tanh"), where + "hidden_act"),
    }


def parse_lfm2_vision_language(
    raw: Mapping[str, Any], text: ArchitectureConfig
) -> VisionLanguageConfig:
    """The VisionLanguageConfig of an LFM2-VL config.json whose text keys gave `text`
    (Lfm2VlConfig's defaults where absent)."""
    tower = _tower(fields.mapping(raw.get("vision_config"), "vision_config"))
    vision = NaflexVisionConfig(
        **tower,
        downsample_factor=fields.integer(raw.get("downsample_factor"), "downsample_factor", 2),
        projector_hidden_size=fields.integer(
            raw.get("projector_hidden_size"), "projector_hidden_size", 2560
        ),
        projector_bias=fields.flag(raw.get("projector_bias"), "projector_bias", True),
        projector_layernorm=fields.flag(
            raw.get("projector_use_layernorm"), "projector_use_layernorm", True
        ),
        projector_act=activation(raw.get("projector_hidden_act", "gelu"), "projector_hidden_act"),
    )
    return VisionLanguageConfig(
        model_type=fields.model_type(raw.get("model_type")),
        text=text,
        vision=vision,
        image_token_id=fields.integer(
            raw.get("image_token_id", raw.get("image_token_index")),
            "image_token_id",
            396,
            positive=False,
        ),
    )
