"""Multi-head latent attention (DeepSeek-V2/V3's MLA): its low-rank sizes, as data.

q comes from a rank-`q_lora_rank` bottleneck (q_a_proj → RMSNorm → q_b_proj) or, when the
rank is null, from one q_proj. Keys and values come from one latent of `kv_lora_rank`
channels (kv_a_proj_with_mqa, whose last `qk_rope_head_dim` channels are one rotary key shared
by every head, → RMSNorm → kv_b_proj giving each head's `qk_nope_head_dim` key channels and
`v_head_dim` value channels). Each head's key is [nope | rope]; only the rope slice rotates.

onnxruntime-genai 0.18 caches keys and values of one head size ([batch, kv_heads, seq,
head_size] for both), so the graph caches the expanded per-head keys and values, the shorter
of the two padded with zeros to `cache_head_dim` (zeros add nothing to q·k, and padded value
channels are cut from the attention output).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError

_SIZES = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclasses.dataclass(frozen=True)
class LatentAttentionConfig:
    """The sizes of multi-head latent attention (see the module docstring)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        """Channels of each head's query and key: the unrotated ones, then the rotated ones."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_head_dim(self) -> int:
        """The head size of the cached keys and values (the longer of q·k's and v's)."""
        return max(self.qk_head_dim, self.v_head_dim)


def read_latent_attention(raw: Mapping[str, Any]) -> LatentAttentionConfig:
    """The LatentAttentionConfig of config.json `raw`; errors name the field."""
    sizes = {name: fields.require(raw, name) for name in _SIZES}
    rank = fields.integer(raw.get("q_lora_rank"), "q_lora_rank")
    if sizes["qk_rope_head_dim"] % 2:
        raise ConfigError(
            f"config.json: field 'qk_rope_head_dim' is {sizes['qk_rope_head_dim']}; accepted: "
            "an even number (rotary channels come in pairs)"
        )
    return LatentAttentionConfig(q_lora_rank=rank, **sizes)


def validate_latent_attention(
    mla: LatentAttentionConfig | None, head_dim: int, heads: int, kv_heads: int
) -> None:
    """The cache the decoder declares (head_dim, kv heads) is the one latent attention fills:
    every head's expanded key and value, `cache_head_dim` channels each."""
    if mla is None:
        return
    if not isinstance(mla, LatentAttentionConfig):
        raise ConfigError(
            f"config.json: latent_attention must be a LatentAttentionConfig, found {mla!r}"
        )
    if head_dim != mla.cache_head_dim or kv_heads != heads:
        raise ConfigError(
            f"config.json: latent attention caches {heads} heads of {mla.cache_head_dim} "
            f"channels, found head_dim {head_dim} and num_key_value_heads {kv_heads}; accepted: "
            "head_dim = max(qk_nope_head_dim + qk_rope_head_dim, v_head_dim), "
            "num_key_value_heads = num_attention_heads"
        )
