"""Differential attention (DiffLlama, arXiv 2410.05258): each pair of query heads attends
twice and the second softmax map, scaled by a learned lambda, is subtracted from the first.

components/differential_attention.py computes it; this section holds what config.json and
the layer's depth decide: lambda_init of layer l is 0.8 - 0.6 * exp(-0.3 * (l + depth_offset))
(transformers' `lambda_init_fn`, l counted from 0), and whether the head outputs pass through
the weightless RMSNorm over each pair's two heads (`head_norm`, the paper's GroupNorm "subln").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DifferentialAttention:
    """The lambda_init depth formula's offset and the head norm switch (module docstring)."""

    depth_offset: int = 0
    head_norm: bool = True

    def lambda_init(self, layer_index: int) -> float:
        """lambda_init of layer `layer_index`: both the lambda's offset and 1 - its output scale."""
        return 0.8 - 0.6 * math.exp(-0.3 * (layer_index + self.depth_offset))


def read_differential(raw: Mapping[str, Any]) -> DifferentialAttention:
    """DiffLlama's section: the value heads split in two halves, so an even number of them
    (DiffLlamaAttention refuses others, as it refuses attention dropout)."""
    heads = fields.require(raw, "num_attention_heads")
    kv_heads = fields.integer(raw.get("num_key_value_heads"), "num_key_value_heads", heads)
    if kv_heads % 2:
        raise ConfigError(
            f"config.json: num_key_value_heads is {kv_heads}; differential attention splits the "
            "value heads in two halves: accepted: an even number"
        )
    dropout = fields.number(raw.get("attention_dropout"), "attention_dropout", 0.0)
    if dropout:
        raise ConfigError(
            f"config.json: attention_dropout is {dropout!r}; differential attention is "
            "supported only without it: accepted: 0"
        )
    return DifferentialAttention()
