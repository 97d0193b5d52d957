"""Multi-head latent attention (DeepSeek-V2/V3's MLA): its low-rank sizes, as data.

q comes from a rank-`q_lora_rank` bottleneck (q_a_proj → RMSNorm → q_b_proj) or, when the
rank is null, from one q_proj. Keys and values come from one latent of `kv_lora_rank`
channels (kv_a_proj_with_mqa, whose last `qk_rope_head_dim` channels are one rotary key shared
by every head, → RMSNorm → kv_b_proj giving each head's `qk_nope_head_dim` key channels and
`v_head_dim` value channels). Each head's key is [nope | rope]; only the rope slice rotates.

The graph attends over the latent itself (components/latent_attention.py: kv_b_proj folded
into the query and the output), so the cache is one head of `cache_head_dim` = kv_lora_rank +
qk_rope_head_dim channels per token, as key and as value: onnxruntime-genai 0.18's decoder
contract with num_key_value_heads 1 (its greedy tokens equal transformers',
tests/models/families/test_bundles.py), 2 * 576 numbers per token and layer for DeepSeek-V2-Lite and V3
where caching every head's expanded key and value would take 16 and 128 times 2 * 192.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.sparse_indexer import IndexerConfig
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
    indexer: IndexerConfig | None = None
    """DeepSeek sparse attention's lightning indexer (config/sparse_indexer.py), or None."""

    @property
    def qk_head_dim(self) -> int:
        """Channels of each head's query and key: the unrotated ones, then the rotated ones."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_head_dim(self) -> int:
        """The channels of the one cached head: the normed latent, the rotated key, then the
        indexer's key where there is an indexer."""
        indexed = 0 if self.indexer is None else self.indexer.head_dim
        return self.kv_lora_rank + self.qk_rope_head_dim + indexed


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
    mla: LatentAttentionConfig | None, head_dim: int, kv_heads: int
) -> None:
    """The cache the decoder declares (head_dim, kv heads) is the one latent attention fills:
    one head of `cache_head_dim` channels."""
    if mla is None:
        return
    if not isinstance(mla, LatentAttentionConfig):
        raise ConfigError(
            f"config.json: latent_attention must be a LatentAttentionConfig, found {mla!r}"
        )
    if head_dim != mla.cache_head_dim or kv_heads != 1:
        raise ConfigError(
            f"config.json: latent attention caches one head of {mla.cache_head_dim} channels, "
            f"found head_dim {head_dim} and num_key_value_heads {kv_heads}; accepted: head_dim = "
            "kv_lora_rank + qk_rope_head_dim (+ index_head_dim), num_key_value_heads = 1"
        )
