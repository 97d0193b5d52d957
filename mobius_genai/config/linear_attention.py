"""Gated-delta-rule layers ("linear_attention": Qwen3.5): the sizes of their heads and conv.

A layer projects [q | k | v] (key_dim, key_dim, value_dim channels), convolves it causally with
a `conv_kernel_size`-tap depthwise kernel and SiLU, then runs the gated delta rule with
`key_heads` query/key heads of `key_head_dim` repeat-interleaved onto `value_heads` value heads
of `value_head_dim`. Its states: the conv's last `conv_kernel_size - 1` columns
[batch, conv_dim, conv_kernel_size - 1] and the recurrence's
[batch, value_heads, key_head_dim, value_head_dim] in float32.

Family variants are fields here: `separate_qkv` (q_proj, k_proj and v_proj stored apart and
concatenated before the conv: OLMo hybrid), `beta_scale` (beta = scale * sigmoid: 2 lets the
update's eigenvalues go negative, OLMo hybrid's `linear_allow_neg_eigval`) and
`gated_norm_eps` (the gated norm's own epsilon; None: the model's `rms_norm_eps`), `rule`
("gated_delta": Qwen3.5's gated delta net, a decay per head; "kimi": Kimi's delta attention, a
decay per key channel, low-rank forget and output gates: components/kimi_delta.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LinearAttentionConfig:
    """Head and conv sizes of the gated-delta-rule layers (see the module docstring)."""

    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_size: int
    separate_qkv: bool = False
    beta_scale: float = 1.0
    gated_norm_eps: float | None = None
    rule: str = "gated_delta"

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolved [q | k | v]."""
        return 2 * self.key_dim + self.value_dim


#: LinearAttentionConfig field → (config.json key, Qwen3_5TextConfig's default).
_KEYS = {
    "key_heads": ("linear_num_key_heads", 16),
    "value_heads": ("linear_num_value_heads", 32),
    "key_head_dim": ("linear_key_head_dim", 128),
    "value_head_dim": ("linear_value_head_dim", 128),
    "conv_kernel_size": ("linear_conv_kernel_dim", 4),
}


def read_linear_attention(raw: Mapping[str, Any]) -> LinearAttentionConfig:
    """The sizes from config.json's `linear_*` keys (defaults as transformers fills them)."""
    sizes = {
        field: fields.integer(raw.get(key), key, default) for field, (key, default) in _KEYS.items()
    }
    config = LinearAttentionConfig(**sizes)
    if config.value_heads % config.key_heads:
        raise ConfigError(
            f"config.json: linear_num_value_heads {config.value_heads} is not a multiple of "
            f"linear_num_key_heads {config.key_heads}; accepted: key heads that share the value "
            "heads evenly"
        )
    if config.conv_kernel_size < 2:
        raise ConfigError(
            f"config.json: linear_conv_kernel_dim is {config.conv_kernel_size}; accepted: 2 or more"
        )
    return config
