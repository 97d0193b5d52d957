"""RG-LRU layers ("rglru": RecurrentGemma's recurrent blocks, Griffin's): their width, the heads
of their block-diagonal gates and the taps of their conv.

A layer projects h to y and x (`width` channels each), convolves x causally with a
`conv_kernel_size`-tap depthwise kernel (with bias), runs the real-gated linear recurrence over
it, one state entry per channel, with input and recurrence gates that are block-diagonal
(`heads` blocks of width / heads channels), multiplies it by gelu(y) and projects back. Its
states: the conv's last `conv_kernel_size - 1` columns [batch, width, conv_kernel_size - 1] in
the model dtype and the recurrence's [batch, width, 1, 1] in float32 (the LinearAttention op's
[batch, heads, key dim, value dim] with a head per channel, as Mamba1's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RgLruConfig:
    """Width, gate heads and conv taps of the RG-LRU layers (see the module docstring)."""

    width: int
    heads: int
    conv_kernel_size: int

    @property
    def block_width(self) -> int:
        """The channels of each gate block."""
        return self.width // self.heads


def read_rglru(raw: Mapping[str, Any]) -> RgLruConfig:
    """RecurrentGemmaConfig's `lru_width` (hidden_size when absent), `num_attention_heads` (the
    gates' blocks) and `conv1d_width` (4); errors name the field."""
    hidden = fields.require(raw, "hidden_size")
    width = fields.integer(raw.get("lru_width"), "lru_width", hidden)
    heads = fields.require(raw, "num_attention_heads")
    taps = fields.integer(raw.get("conv1d_width"), "conv1d_width", 4)
    if taps < 2:
        raise ConfigError(f"config.json: conv1d_width is {taps}; accepted: 2 or more")
    if width % heads:
        raise ConfigError(
            f"config.json: lru_width {width} is not a multiple of num_attention_heads {heads}; "
            "accepted: a width the gates' blocks divide"
        )
    return RgLruConfig(width=width, heads=heads, conv_kernel_size=taps)
