"""Head sizes and counts families derive from config.json where transformers' config class
does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


def split_hidden(raw: Mapping[str, Any]) -> int:
    """The head size of families whose classes never read head_dim (gpt2, gptj): hidden_size
    split evenly over the heads."""
    hidden, heads = fields.require(raw, "hidden_size"), fields.require(raw, "num_attention_heads")
    if hidden % heads:
        raise ConfigError(
            f"config.json: {raw.get('model_type')} needs hidden_size {hidden} divisible by "
            f"num_attention_heads {heads}; accepted: a multiple of num_attention_heads"
        )
    return hidden // heads


def kv_head_per_head(raw: Mapping[str, Any]) -> int:
    """The key/value heads of families without grouped queries (gpt2, bloom, opt, ...): one
    per attention head."""
    return fields.require(raw, "num_attention_heads")


def hidden_over_heads(raw: Mapping[str, Any]) -> int:
    """The head size of families whose attention always splits hidden_size evenly over the
    heads while transformers' rotary embedding sizes itself from a head_dim key (stablelm,
    gpt_neox): a head_dim other than the quotient is refused."""
    size = split_hidden(raw)
    head_dim = raw.get("head_dim")
    if head_dim not in (None, size):
        raise ConfigError(
            f"config.json: {raw.get('model_type')} needs head_dim absent or equal to "
            f"hidden_size / num_attention_heads ({size}), found head_dim {head_dim!r}"
        )
    return size


def exaone_kv_heads(raw: Mapping[str, Any]) -> int:
    """ExaoneConfig: 8 key/value heads when the key is absent, one per query head when null."""
    return fields.require(raw, "num_attention_heads") if "num_key_value_heads" in raw else 8
