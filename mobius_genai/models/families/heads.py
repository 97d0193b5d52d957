"""Head sizes and counts families derive from config.json where transformers' config class
does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


def hidden_over_heads(raw: Mapping[str, Any]) -> int:
    """The head size of families whose attention always splits hidden_size evenly over the
    heads, whatever a head_dim key says (stablelm, gpt_neox)."""
    hidden, heads = fields.require(raw, "hidden_size"), fields.require(raw, "num_attention_heads")
    head_dim = raw.get("head_dim")
    if hidden % heads or head_dim not in (None, hidden // heads):
        raise ConfigError(
            f"config.json: {raw.get('model_type')} needs hidden_size {hidden} divisible by "
            f"num_attention_heads {heads} and head_dim absent or equal to the quotient, found "
            f"head_dim {head_dim!r}"
        )
    return hidden // heads


def exaone_kv_heads(raw: Mapping[str, Any]) -> int:
    """ExaoneConfig: 8 key/value heads when the key is absent, one per query head when null."""
    return fields.require(raw, "num_attention_heads") if "num_key_value_heads" in raw else 8
