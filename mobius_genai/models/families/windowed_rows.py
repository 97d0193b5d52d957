"""Decoders whose difference is sliding-window layers: cwm (Meta's Code World Model: llama's
layer, q/k/v/o without biases, every fourth layer from the first attending in full, the others
over `sliding_window` tokens); granite_swa and granitemoe_swa (granite's and granitemoeshared's
layers and multipliers, the same layer pattern, a learned sink logit per head in every
attention (components/sinks.py) and a rope base per layer, `layer_rope_theta`, 0 for none).

Defaults are what each row's transformers config class fills in when config.json lacks the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_MLP_BIAS, UNBIASED_ATTENTION
from mobius_genai.models.families.layers import leading_full_layer_types
from mobius_genai.models.families.moe_rows import MOE_FAMILIES
from mobius_genai.models.families.rope import layer_rope_thetas
from mobius_genai.models.families.scales import GRANITE_MULTIPLIERS

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

#: What GraniteSWAConfig and GraniteMoeSWAConfig add to their base classes' defaults.
_GRANITE_SWA_DEFAULTS = {"sliding_window": 128, "layer_types": leading_full_layer_types(4)}
#: The sinks and the per-layer rope bases of both granite SWA rows.
_GRANITE_SWA_ATTENTION = {"attention_sinks": True, "layer_rope_thetas": layer_rope_thetas}

GRANITE_SWA = FamilyAdapter(
    model_type="granite_swa",
    family_keys=READS_MLP_BIAS,
    config_defaults={
        **_GRANITE_SWA_DEFAULTS,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    config_overrides={**GRANITE_MULTIPLIERS, **_GRANITE_SWA_ATTENTION},
)

_GRANITEMOESHARED = next(row for row in MOE_FAMILIES if row.model_type == "granitemoeshared")
#: granitemoeshared's row, its router and experts under transformers 5's names (no conversion
#: mapping renames them on save): block_sparse_moe.router, experts.gate_up_proj [E, 2I, H]
#: ([gate | up] rows) and experts.down_proj [E, H, I]
GRANITEMOE_SWA = dataclasses.replace(
    _GRANITEMOESHARED,
    model_type="granitemoe_swa",
    config_defaults={**_GRANITEMOESHARED.config_defaults, **_GRANITE_SWA_DEFAULTS},
    config_overrides={**_GRANITEMOESHARED.config_overrides, **_GRANITE_SWA_ATTENTION},
    weight_renames=(
        (r"\.mlp\.gate\.", ".block_sparse_moe.router."),
        (r"\.mlp\.experts$", ".block_sparse_moe.experts"),
        (r"\.mlp\.(shared_expert\.)?down_proj\.", ".shared_mlp.output_linear."),
    ),
    experts=ExpertLayout(gate="gate_up_proj", up=None, down="down_proj"),
)

WINDOWED_FAMILIES = (CWM, GRANITE_SWA, GRANITEMOE_SWA)
