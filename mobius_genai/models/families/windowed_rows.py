"""Llama-style decoders whose only difference is sliding-window layers: cwm (Meta's Code World
Model: llama's layer, q/k/v/o without biases, every fourth layer from the first attending in
full, the others over `sliding_window` tokens).

Defaults are what CwmConfig fills in when config.json lacks the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_MLP_BIAS, UNBIASED_ATTENTION
from mobius_genai.models.families.layers import leading_full_layer_types

#: CwmConfig's rope_parameters when config.json has no rope dict (a top-level rope_theta is
#: then ignored, as CwmConfig ignores it).
_CWM_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 1_000_000.0,
    "factor": 16.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}


def _cwm_rope(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    return None if raw.get("rope_scaling") is not None else dict(_CWM_ROPE)


CWM = FamilyAdapter(
    model_type="cwm",
    family_keys=READS_MLP_BIAS,
    config_defaults={
        "rope_parameters": _cwm_rope,
        "rope_theta": 1_000_000.0,  # CwmConfig's default_theta, for a rope_scaling without one
        "head_dim": 128,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "sliding_window": 8192,
        "layer_types": leading_full_layer_types(4),
        "eos_token_id": [128001, 128008, 128009],
    },
    config_overrides=UNBIASED_ATTENTION,  # CwmAttention's projections never have a bias
)

WINDOWED_FAMILIES = (CWM,)
