"""The Gemma decoders of the family table: gemma, gemma2, gemma3_text (each the one before
with more), Gemma 3n's text decoder and its hub checkpoints built text-only. Their norms scale
by 1 + weight (offset_norm_weights) except Gemma 3n's; defaults are what each transformers
config class fills in when config.json lacks the key. (Gemma 4: gemma4_rows.py.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mobius_genai.config.altup import altup_section
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.gemma_hub import gemma_hub_row
from mobius_genai.models.families.layers import alternating_layer_types
from mobius_genai.models.families.preprocess import NORM_WEIGHTS, offset_norm_weights
from mobius_genai.models.families.readers import gemma_activation, when_absent
from mobius_genai.models.families.scales import (
    FINAL_SOFTCAP,
    GEMMA2_SOFTCAPS,
    query_pre_attn_scale,
    softcap,
    sqrt_hidden,
)

_GEMMA_REFUSED = ("use_bidirectional_attention",)
# Gemma3TextConfig's and Gemma3nTextConfig's default_theta: global (full layers), local.
_GEMMA3_ROPE = {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}


def _gemma_heads(head_dim: int, kv_heads: int) -> dict[str, Any]:
    """The gemma config classes' head size and key/value heads, where config.json lacks them."""
    return {
        "head_dim": when_absent("head_dim", head_dim),
        "num_key_value_heads": when_absent("num_key_value_heads", kv_heads),
    }


# What gemma2 changes over gemma; gemma3_text and vaultgemma build on it.
GEMMA2_OVERRIDES = {
    "embedding_multiplier": sqrt_hidden,
    "hidden_act": gemma_activation,
    "norm_placement": "sandwich",
    "attention_scale": query_pre_attn_scale,
    **GEMMA2_SOFTCAPS,
}


_GEMMA2 = FamilyAdapter(
    model_type="gemma2",
    genai_type="gemma2",
    config_defaults={
        "tie_word_embeddings": True,
        "layer_types": alternating_layer_types(2),
        **_gemma_heads(256, 4),
    },
    config_overrides=GEMMA2_OVERRIDES,
    refused_keys=_GEMMA_REFUSED,
    preprocess_weight=offset_norm_weights,
    preprocessed_weights=NORM_WEIGHTS,
)
# gemma2's layer with per-head q/k norms, sliding layers rotating by their own base
_GEMMA3_TEXT = dataclasses.replace(
    _GEMMA2,
    model_type="gemma3_text",
    genai_type="gemma3_text",
    config_defaults={
        **_GEMMA2.config_defaults,
        "layer_types": alternating_layer_types(6),
        **_GEMMA3_ROPE,
    },
    config_overrides={
        **GEMMA2_OVERRIDES,
        "qk_norm": True,
        **FINAL_SOFTCAP,
        # Gemma3Attention keeps attn_logit_softcapping but never applies it.
        "attn_logit_softcapping": None,
    },
)


# AltUp streams, per-layer inputs, Laurel, sparse MLPs, shared caches: config/altup.py; its
# RMSNorms scale by the weight itself (no gemma offset)
_GEMMA3N_TEXT = FamilyAdapter(
    model_type="gemma3n_text",
    config_defaults={
        "tie_word_embeddings": True,
        "layer_types": alternating_layer_types(5),
        **_gemma_heads(256, 2),
        **_GEMMA3_ROPE,
        "num_kv_shared_layers": 15,
    },
    config_overrides={
        "final_logit_softcapping": softcap("final_logit_softcapping", 30.0),
        "embedding_multiplier": sqrt_hidden,
        "hidden_act": gemma_activation,
        "attention_scale": 1.0,
        "altup": altup_section,
    },
    refused_keys=_GEMMA_REFUSED,
    # the layers sharing an earlier cache have no k/v of their own (hub files keep them)
    unused_weights=(r"\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.",),
)
# Gemma3nTextConfig's defaults for the keys gemma3n_text's row requires
_GEMMA3N_TEXT_DEFAULTS = {
    "vocab_size": 262_400,
    "hidden_size": 2048,
    "intermediate_size": 16_384,
    "num_attention_heads": 8,
    "max_position_embeddings": 32_768,
    "sliding_window": 512,
}
_GEMMA3N_HUB = gemma_hub_row(_GEMMA3N_TEXT, "gemma3n", _GEMMA3N_TEXT_DEFAULTS)

GEMMA_FAMILIES = (
    FamilyAdapter(
        model_type="gemma",
        genai_type="gemma",
        config_defaults={
            "tie_word_embeddings": True,
            "hidden_act": "gelu_pytorch_tanh",
            **_gemma_heads(256, 16),
        },
        config_overrides={"embedding_multiplier": sqrt_hidden},
        refused_keys=_GEMMA_REFUSED,
        preprocess_weight=offset_norm_weights,
        preprocessed_weights=NORM_WEIGHTS,
    ),
    _GEMMA2,
    _GEMMA3_TEXT,
    _GEMMA3N_TEXT,
    # Gemma 3n's hub checkpoints (Gemma3nForConditionalGeneration) built text-only
    _GEMMA3N_HUB,
)
