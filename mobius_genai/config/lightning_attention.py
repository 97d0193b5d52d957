"""Lightning attention layers ("lightning_attention": MiniMax-Text-01's linear attention): their
heads and each layer's per-head decay.

A layer projects silu([q_h | k_h | v_h]) for each of `heads` heads of `head_dim` channels and
runs linear attention with a fixed exponential decay: S_t = exp(-slope_h) S_{t-1} + k_t ⊗ v_t,
o_t = q_t^T S_t (no softmax, no scale). The slopes fall geometrically over the heads and
linearly over the layers (MiniMaxLightningAttention.get_slope_rate):

    slope[layer][h] = (2 ** (-8 / heads)) ** (h + 1) * (1 - layer / (layers - 1 + 1e-5) + 1e-5)

Its state: S [batch, heads, head_dim, head_dim] in float32. og 0.18 finds a recurrent layer by
its conv state, which lightning attention has none of: the block carries a [batch, 1, 1] one
through unchanged (config/recurrent.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields

#: MiniMaxLightningAttention's RMSNorm over the heads' output: MiniMaxRMSNorm's default eps,
#: whatever rms_norm_eps says.
NORM_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class LightningAttentionConfig:
    """Heads, head size and each layer's per-head slopes (see the module docstring)."""

    heads: int
    head_dim: int
    slopes: tuple[tuple[float, ...], ...]
    norm_eps: float = NORM_EPS

    @property
    def width(self) -> int:
        """Channels of q, k, v and the output: heads * head_dim."""
        return self.heads * self.head_dim


def slope_rates(heads: int, layers: int) -> tuple[tuple[float, ...], ...]:
    """Each layer's per-head decay rate, as MiniMaxLightningAttention.get_slope_rate."""
    base = 1 / (2 ** (8 / heads))
    return tuple(
        tuple(base ** (h + 1) * (1 - layer / (layers - 1 + 1e-5) + 1e-5) for h in range(heads))
        for layer in range(layers)
    )


def read_lightning_attention(raw: Mapping[str, Any]) -> LightningAttentionConfig:
    """MiniMaxConfig's `num_attention_heads`, `head_dim` (hidden_size / heads when absent) and
    `num_hidden_layers` (the slopes' layer factor); errors name the field."""
    heads = fields.require(raw, "num_attention_heads")
    hidden = fields.require(raw, "hidden_size")
    head_dim = fields.integer(raw.get("head_dim"), "head_dim", hidden // heads)
    layers = fields.require(raw, "num_hidden_layers")
    return LightningAttentionConfig(heads, head_dim, slope_rates(heads, layers))
