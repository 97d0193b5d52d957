"""Scaling constants families derive from config.json: embedding multipliers, softmax scales,
logit scales and softcaps.

Each is read only by the rows whose transformers class reads its key: a key that a family's
class ignores (final_logit_softcapping in a Qwen3.5 config.json) changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.models.families.readers import positive_number

#: granite's four multipliers (granite, granitemoe), each from its config.json key.
GRANITE_MULTIPLIERS = {
    "embedding_multiplier": positive_number("embedding_multiplier"),
    "residual_multiplier": positive_number("residual_multiplier"),
    "logits_scaling": positive_number("logits_scaling"),
    "attention_scale": positive_number("attention_multiplier"),
}


def softcap(key: str, absent: float | None) -> Callable[[Mapping[str, Any]], float | None]:
    """An override: the positive softcap `key` of config.json (cap * tanh(x / cap)); `absent`
    when config.json lacks it, as the family's transformers config fills it in; None when null."""
    return lambda raw: fields.number(raw[key], key, positive=True) if key in raw else absent


#: The softcaps of the families whose attention and CausalLM apply both (gemma2, vaultgemma),
#: with Gemma2Config's defaults.
GEMMA2_SOFTCAPS = {
    "attn_logit_softcapping": softcap("attn_logit_softcapping", 50.0),
    "final_logit_softcapping": softcap("final_logit_softcapping", 30.0),
}
#: The logit softcap of a family whose CausalLM alone applies one (gemma3, whose config
#: leaves it off by default).
FINAL_SOFTCAP = {"final_logit_softcapping": softcap("final_logit_softcapping", None)}


def query_pre_attn_scale(raw: Mapping[str, Any]) -> float:
    """gemma2/3's softmax scale: query_pre_attn_scalar ** -0.5 (256 when absent)."""
    key = "query_pre_attn_scalar"
    return fields.number(raw.get(key), key, 256.0, positive=True) ** -0.5


def sqrt_hidden(raw: Mapping[str, Any]) -> float:
    """gemma's embedding multiplier: sqrt(hidden_size)."""
    return math.sqrt(fields.require(raw, "hidden_size"))


def inverse_logit_scale(raw: Mapping[str, Any]) -> float:
    """cohere multiplies the logits by `logit_scale`; the graph divides by its inverse."""
    return 1.0 / fields.number(raw.get("logit_scale"), "logit_scale", 0.0625, positive=True)


def gpt2_scale(raw: Mapping[str, Any]) -> float | None:
    """GPT-2's softmax scale: 1/sqrt(head_dim) (None) unless scale_attn_weights is false."""
    return None if fields.flag(raw.get("scale_attn_weights"), "scale_attn_weights", True) else 1.0
