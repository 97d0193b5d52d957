"""Gemma 4's audio side (E2B, E4B): the conformer tower's sizes and the embedder into the text.

A clip arrives as log-mel frames [frames, mel bins]; two stride-2 convolutions cut the frames
by four into the tower's tokens, each a conformer layer refines (macaron feed-forwards around
chunked local self-attention with relative positions and a light depthwise convolution), and
the embedder projects each token into the text's hidden size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.architecture import ArchitectureConfig, activation
from mobius_genai.config.layers import UniformTower
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Gemma4AudioConfig(UniformTower):
    """transformers' Gemma4AudioConfig, the keys the graph reads (its defaults), and the text
    hidden size the embedder projects into."""

    hidden_size: int = 1024
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    hidden_act: str = "silu"
    subsampling_conv_channels: tuple[int, int] = (128, 32)
    conv_kernel_size: int = 5
    residual_weight: float = 0.5
    attention_chunk_size: int = 12
    attention_context_left: int = 13
    attention_context_right: int = 0
    attention_logit_cap: float = 50.0
    attention_invalid_logits_value: float = -1.0e9
    use_clipped_linears: bool = True
    rms_norm_eps: float = 1e-6
    gradient_clipping: float = 1e10
    output_proj_dims: int = 1536
    text_hidden_size: int = 2304

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def past_horizon(self) -> int:
        """Keys before a chunk's first query that its context holds."""
        return self.attention_context_left - 1

    @property
    def context_size(self) -> int:
        """Keys one chunk of queries sees: its past horizon, itself and its future horizon."""
        return self.attention_chunk_size + self.past_horizon + self.attention_context_right

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], text: ArchitectureConfig) -> Gemma4AudioConfig:
        """Parse `audio_config` of a Gemma 4 config.json whose text decoder is `text`."""
        where = "audio_config."
        defaults = cls()
        sizes = {
            key: fields.integer(raw.get(key), where + key, getattr(defaults, key))
            for key in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "conv_kernel_size",
                "attention_chunk_size",
                "attention_context_left",
                "output_proj_dims",
            )
        }
        numbers = {
            key: fields.number(raw.get(key), where + key, getattr(defaults, key))
            for key in (
                "residual_weight",
                "attention_logit_cap",
                "attention_invalid_logits_value",
                "gradient_clipping",
            )
        }
        channels = fields.int_tuple(
            raw.get("subsampling_conv_channels", defaults.subsampling_conv_channels),
            where + "subsampling_conv_channels",
        )
        config = cls(
            **sizes,
            **numbers,
            hidden_act=activation(raw.get("hidden_act", defaults.hidden_act), where + "hidden_act"),
            subsampling_conv_channels=channels,  # type: ignore[arg-type]
            attention_context_right=fields.integer(
                raw.get("attention_context_right"),
                where + "attention_context_right",
                0,
                positive=False,
            ),
            use_clipped_linears=fields.flag(
                raw.get("use_clipped_linears"), where + "use_clipped_linears", True
            ),
            rms_norm_eps=fields.number(
                raw.get("rms_norm_eps"), where + "rms_norm_eps", 1e-6, positive=True
            ),
            text_hidden_size=text.hidden_size,
        )
        _check(config)
        return config


def _check(config: Gemma4AudioConfig) -> None:
    where = "config.json: audio_config."
    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(
            f"{where}hidden_size {config.hidden_size} is not a multiple of "
            f"num_attention_heads {config.num_attention_heads}"
        )
    if len(config.subsampling_conv_channels) != 2 or config.subsampling_conv_channels[0] % 4:
        raise ConfigError(
            f"{where}subsampling_conv_channels is {list(config.subsampling_conv_channels)}; "
            "accepted: two channel counts, the first a multiple of 4 (the mel bins the two "
            "stride-2 convolutions leave)"
        )


def parse_gemma4_audio(
    raw: Mapping[str, Any], text: ArchitectureConfig
) -> Gemma4AudioConfig | None:
    """The audio tower of a Gemma 4 config.json (None: the checkpoint has none, 26B and 31B)."""
    section = raw.get("audio_config")
    if section is None:
        return None
    return Gemma4AudioConfig.from_dict(fields.mapping(section, "audio_config"), text)
