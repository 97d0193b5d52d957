"""Gemma 4's vision side: the tower's sizes, its pooling and the embedder into the text.

Images arrive cut into patches (`patch_size`² pixels of 3 channels, values in [0, 1]) with each
patch's (column, row); padding patches have (-1, -1). Each patch is a token of the tower,
placed by a learned table per axis and rotated by its column (first half of each head) and row
(second half); `pooling_kernel_size`² neighbouring patches are averaged into one image token,
which the embedder projects into the text's hidden size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.architecture import ArchitectureConfig, activation
from mobius_genai.config.gemma4_audio import parse_gemma4_audio
from mobius_genai.config.layers import UniformTower
from mobius_genai.config.rope import axial_rope_parameters
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.errors import ConfigError

#: onnxruntime-genai 0.18's Gemma 4 processor cuts an image's padding to its soft tokens times
#: 3² patches, whatever the config says: the one pooling kernel its bundles can take.
OG_POOLING_KERNEL = 3


@dataclasses.dataclass(frozen=True)
class Gemma4VisionConfig(UniformTower):
    """transformers' Gemma4VisionConfig, the keys the graph reads (its defaults), and the text
    hidden size the embedder projects into."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 16
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    head_dim: int = 64
    hidden_act: str = "gelu_pytorch_tanh"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100.0
    pooling_kernel_size: int = 3
    patch_size: int = 16
    position_embedding_size: int = 10 * 1024
    use_clipped_linears: bool = False
    standardize: bool = False
    text_hidden_size: int = 2304
    num_channels: int = 3

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: patch_size² pixels of 3 channels."""
        return 3 * self.patch_size * self.patch_size

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], text: ArchitectureConfig) -> Gemma4VisionConfig:
        """Parse `vision_config` of a Gemma 4 config.json whose text decoder is `text`."""
        where = "vision_config."
        defaults = cls()
        sizes = {
            key: fields.integer(raw.get(key), where + key, getattr(defaults, key))
            for key in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "pooling_kernel_size",
                "patch_size",
                "position_embedding_size",
            )
        }
        rope = axial_rope_parameters(raw, where, "Gemma 4")
        config = cls(
            **sizes,
            hidden_act=activation(
                raw.get("hidden_activation", raw.get("hidden_act", defaults.hidden_act)),
                where + "hidden_activation",
            ),
            rms_norm_eps=fields.number(
                raw.get("rms_norm_eps"),
                where + "rms_norm_eps",
                defaults.rms_norm_eps,
                positive=True,
            ),
            rope_theta=fields.number(
                rope.get("rope_theta"), where + "rope_parameters.rope_theta", 100.0, positive=True
            ),
            use_clipped_linears=fields.flag(
                raw.get("use_clipped_linears"), where + "use_clipped_linears", False
            ),
            standardize=fields.flag(raw.get("standardize"), where + "standardize", False),
            text_hidden_size=text.hidden_size,
        )
        _check(config)
        return config


def _check(config: Gemma4VisionConfig) -> None:
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConfigError(
            f"config.json: vision_config.num_attention_heads {config.num_attention_heads} is "
            f"not a multiple of vision_config.num_key_value_heads {config.num_key_value_heads}"
        )
    if config.head_dim % 4:
        raise ConfigError(
            f"config.json: vision_config.head_dim {config.head_dim} must be divisible by 4 "
            "(a rotated half per image axis)"
        )
    if config.pooling_kernel_size != OG_POOLING_KERNEL:
        raise ConfigError(
            "config.json: field 'vision_config.pooling_kernel_size' is "
            f"{config.pooling_kernel_size}; "
            f"accepted: {OG_POOLING_KERNEL} (onnxruntime-genai 0.18's Gemma 4 processor "
            "pools 3 x 3 patches)"
        )


def parse_gemma4_vision_language(
    raw: Mapping[str, Any], text: ArchitectureConfig
) -> VisionLanguageConfig:
    """The VisionLanguageConfig of a Gemma 4 config.json whose `text_config` gave `text`
    (Gemma4Config's token ids where absent); images keep their aspect ratio, so no fixed
    token count."""
    if raw.get("vision_config") is None:
        raise ConfigError(
            "config.json: a gemma4 checkpoint without 'vision_config' has no vision tower; "
            "package its text decoder as model_type 'gemma4_text'"
        )
    vision = Gemma4VisionConfig.from_dict(
        fields.mapping(raw.get("vision_config"), "vision_config"), text
    )
    # "vision": an image's tokens attend to each other both ways in the sliding layers ("all"
    # is refused with the text config)
    both_ways = fields.mapping(raw.get("text_config"), "text_config").get(
        "use_bidirectional_attention"
    )
    ids = {
        key: fields.integer(raw.get(key), key, default, positive=False)
        for key, default in (
            ("image_token_id", 258_880),
            ("boi_token_id", 255_999),
            ("eoi_token_id", 258_882),
            ("video_token_id", 258_884),
            ("audio_token_id", 258_881),
        )
    }
    audio = ids.pop("audio_token_id")
    soft = (ids["image_token_id"], ids["video_token_id"], audio)
    # transformers embeds the soft tokens as the pad token (their per-layer rows too)
    pad = 0 if text.pad_token_id is None else text.pad_token_id
    section = text.per_layer_stack
    if section is not None:
        section = dataclasses.replace(section, soft_tokens=(pad, soft))
    return VisionLanguageConfig(
        model_type=fields.model_type(raw.get("model_type")),
        text=dataclasses.replace(text, per_layer_stack=section),
        vision=vision,
        bidirectional_images=both_ways == "vision",
        audio=parse_gemma4_audio(raw, text),
        audio_token_id=audio,
        placeholder_text=(pad, soft),
        **ids,
    )
