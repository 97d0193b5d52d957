"""Mistral's decoders: mistral, Ministral (2410: `ministral`, sliding and full layers as
`layer_types` says) and Ministral 3 (`ministral3`: yarn rope and a query scale that grows with
the position, config/local_global.py's TemperatureTuning in every layer).

onnxruntime-genai 0.18 knows none of ministral and ministral3; its "mistral" type runs their
graphs (the window and the query scale live in the graph). Defaults are what each transformers
config class fills in when config.json lacks the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.local_global import LocalGlobalAttention, TemperatureTuning
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import UNBIASED_ATTENTION
from mobius_genai.models.families.readers import when_absent

_ROPE_KEYS = ("rope_parameters", "rope_scaling")
#: Ministral3Config's rope_parameters when config.json has none.
_MINISTRAL3_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1_000_000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}


def _ministral3_rope(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    return None if any(key in raw for key in _ROPE_KEYS) else dict(_MINISTRAL3_ROPE)


def ministral3_query_scale(raw: Mapping[str, Any]) -> LocalGlobalAttention | None:
    """Each query of every layer times 1 + beta * log(1 + floor(position / original)) (beta:
    the rope dict's llama_4_scaling_beta, original: its original_max_position_embeddings, both
    read there alone, as Ministral3Attention reads them); None where beta is 0 (a factor of 1)."""
    params: dict[str, Any] = {}
    for key in _ROPE_KEYS:
        params.update({k: v for k, v in fields.mapping(raw.get(key), key).items() if v is not None})
    source = next((key for key in _ROPE_KEYS if raw.get(key)), _ROPE_KEYS[0])
    beta = fields.number(params.get("llama_4_scaling_beta"), f"{source}.llama_4_scaling_beta")
    original = fields.integer(
        params.get("original_max_position_embeddings"), f"{source}.original_max_position_embeddings"
    )
    if beta is None or original is None or original <= 0 or beta < 0:
        raise ConfigError(
            f"config.json: {source}.llama_4_scaling_beta {beta!r} and "
            f"{source}.original_max_position_embeddings {original!r}; accepted for ministral3: a "
            "number >= 0 and a positive integer (each query scales by their position factor)"
        )
    if beta == 0:
        return None
    tuning = TemperatureTuning(
        floor_scale=float(original), scale=float(beta), position_offset=0, every_layer=True
    )
    return LocalGlobalAttention(chunk_size=None, temperature=tuning)


#: MistralConfig's, MinistralConfig's and Ministral3Config's key/value heads.
_KV_HEADS = {"num_key_value_heads": when_absent("num_key_value_heads", 8)}

MISTRAL = FamilyAdapter(
    model_type="mistral",
    genai_type="mistral",
    config_defaults={
        **_KV_HEADS,
        # every layer sliding (MistralConfig's default window); an explicit null keeps none
        "sliding_window": when_absent("sliding_window", 4096),
    },
    config_overrides=UNBIASED_ATTENTION,
)

MINISTRAL = FamilyAdapter(
    model_type="ministral",
    genai_type="mistral",
    config_defaults={
        **_KV_HEADS,
        "max_position_embeddings": 131_072,
        # every layer sliding unless layer_types says otherwise (MinistralConfig's rule, which
        # config/layers.py's parse_layer_types follows); an explicit null keeps none
        "sliding_window": when_absent("sliding_window", 4096),
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    config_overrides=UNBIASED_ATTENTION,
)

MINISTRAL3 = FamilyAdapter(
    model_type="ministral3",
    genai_type="mistral",
    config_defaults={
        **_KV_HEADS,
        "head_dim": when_absent("head_dim", 128),
        "max_position_embeddings": 262_144,
        "rms_norm_eps": 1e-5,
        "rope_parameters": _ministral3_rope,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 11,
    },
    config_overrides={**UNBIASED_ATTENTION, "local_global": ministral3_query_scale},
)

MISTRAL_FAMILIES = (MISTRAL, MINISTRAL, MINISTRAL3)
