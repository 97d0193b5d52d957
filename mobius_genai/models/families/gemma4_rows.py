"""Gemma 4's row: `gemma4_text` (Gemma4ForCausalLM; the hub's multimodal `gemma4` checkpoints
are a vision-language row, models/vision_language.py, whose text is this row). What the decoder
holds is config/per_layer_stack.py's section; its RMSNorms scale by the weight itself (no gemma
offset) and attention scores are unscaled (q and k are normed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config.per_layer_stack import FULL, per_layer_stack
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY
from mobius_genai.models.families.readers import gemma_activation
from mobius_genai.models.families.scales import FINAL_SOFTCAP, sqrt_hidden

_SLIDING = "sliding_attention"


def _layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Five sliding layers to one full, the last layer full (Gemma4TextConfig's defaults)."""
    layers = int(raw["num_hidden_layers"])
    types = [_SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
    return [*types[:-1], FULL]


GEMMA4_TEXT = FamilyAdapter(
    model_type="gemma4_text",
    # og's builder's type; og 0.18 reads each layer's cache shape from the graph's inputs
    genai_type="gemma4_text",
    family_keys=READS_PARTIAL_ROTARY,
    config_defaults={
        "tie_word_embeddings": True,
        "layer_types": _layer_types,
        "head_dim": 256,
        "num_key_value_heads": 4,
        "max_position_embeddings": 131_072,
        "sliding_window": 512,
        "rope_parameters": {
            _SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
    },
    config_overrides={
        **FINAL_SOFTCAP,
        "embedding_multiplier": sqrt_hidden,
        "hidden_act": gemma_activation,
        "attention_scale": 1.0,
        "norm_placement": "sandwich",
        "per_layer_stack": per_layer_stack,
    },
    experts=ExpertLayout(gate="gate_up_proj", up=None, down="down_proj"),
    # the layers sharing an earlier cache have no k/v of their own (hub files may keep them)
    unused_weights=(r"\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.",),
)

GEMMA4_FAMILIES = (GEMMA4_TEXT,)
