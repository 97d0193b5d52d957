"""Scaling constants families derive from config.json: embedding multipliers, softmax scales,
logit scales and softcaps.

Each is read only by the rows whose transformers class reads its key: a key that a family's
class ignores (final_logit_softcapping in a Qwen3.5 config.json) changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.models.families.readers import optional_positive, positive_number, when_absent

#: granite's four multipliers (granite, granitemoe), each from its config.json key.
GRANITE_MULTIPLIERS = {
    "embedding_multiplier": positive_number("embedding_multiplier"),
    "residual_multiplier": positive_number("residual_multiplier"),
    "logits_scaling": positive_number("logits_scaling"),
    "attention_scale": positive_number("attention_multiplier"),
}

#: The logit softcap (cap * tanh(logits / cap)) of the families whose CausalLM applies
#: config.json's `final_logit_softcapping` (gemma2, gemma3, gemma3n, vaultgemma, gemma4).
FINAL_SOFTCAP = {"final_logit_softcapping": optional_positive("final_logit_softcapping")}
#: With FINAL_SOFTCAP, the attention-score softcap of the families whose attention applies
#: `attn_logit_softcapping` (gemma2, vaultgemma).
SOFTCAPS = {
    **FINAL_SOFTCAP,
    "attn_logit_softcapping": optional_positive("attn_logit_softcapping"),
}
#: The softcaps Gemma2Config (and VaultGemmaConfig) fill in when config.json lacks them; an
#: explicit null turns a cap off.
GEMMA2_SOFTCAP_DEFAULTS = {
    "attn_logit_softcapping": when_absent("attn_logit_softcapping", 50.0),
    "final_logit_softcapping": when_absent("final_logit_softcapping", 30.0),
}


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
