"""Short-convolution layers ("conv": LFM2): the taps and bias of their depthwise causal conv.

A layer projects x to [B | C | x'] (hidden_size channels each), convolves B * x' causally with a
`kernel_size`-tap depthwise kernel, gates it by C and projects back. Its state: the conv's last
`kernel_size - 1` columns [batch, hidden_size, kernel_size - 1] in the model dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ShortConvConfig:
    """Taps and bias of the short convolutions (see the module docstring)."""

    kernel_size: int
    bias: bool = False

    @property
    def cache_size(self) -> int:
        """Columns of the state: the inputs the next token's window still needs."""
        return self.kernel_size - 1


def read_short_conv(raw: Mapping[str, Any]) -> ShortConvConfig:
    """The sizes from Lfm2Config's `conv_L_cache` (3 when absent) and `conv_bias` (false)."""
    taps = fields.integer(raw.get("conv_L_cache"), "conv_L_cache", 3)
    if taps < 2:
        raise ConfigError(
            f"config.json: conv layers need a kernel of at least 2 taps (conv_L_cache), found "
            f"{taps!r}"
        )
    return ShortConvConfig(taps, fields.flag(raw.get("conv_bias"), "conv_bias", False))
