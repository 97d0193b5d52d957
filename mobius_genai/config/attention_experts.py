"""JetMoE's mixture of attention heads (MoA): each token routes to `top_k` of `num_experts`
attention experts, each owning a query projection and an output projection, while every
expert shares one key/value projection.

components/attention_experts.py computes it; this section holds the routing sizes. The layer
then has num_key_value_heads * top_k query heads (transformers' JetMoeConfig sets
num_attention_heads so), each of head_dim = kv_channels channels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class AttentionExperts:
    """The attention experts of every layer and how many each token uses."""

    num_experts: int
    top_k: int


def read_attention_experts(raw: Mapping[str, Any]) -> AttentionExperts:
    """JetMoE's `num_local_experts` and `num_experts_per_tok` (shared with its MLP experts)."""
    experts = fields.integer(raw.get("num_local_experts"), "num_local_experts", 8)
    top_k = fields.integer(raw.get("num_experts_per_tok"), "num_experts_per_tok", 2)
    if not 1 <= top_k <= experts:
        raise ConfigError(
            f"config.json: num_experts_per_tok is {top_k}; accepted: 1..{experts} "
            "(num_local_experts)"
        )
    return AttentionExperts(num_experts=experts, top_k=top_k)
