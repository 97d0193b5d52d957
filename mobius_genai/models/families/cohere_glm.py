"""Cohere's and GLM's rows and the generations built on them, each a copy of its parent's row
with what its transformers class changes.

cohere2 (Command R7B, Command A) is cohere's parallel block and logit scale over sliding and
full-attention layers, where only the sliding layers rotate (Cohere2Attention applies rope only
with a window) and the q/k norms are gone. glm4 (GLM-4-0414, GLM-Z1) is glm's layer with
sandwich norms: post_self_attn_layernorm after attention, post_mlp_layernorm after the MLP, and
post_attention_layernorm, as in glm, before the MLP. Neither class keeps a parameter in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter, FusedWeight
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY
from mobius_genai.models.families.layers import alternating_layer_types
from mobius_genai.models.families.readers import switch
from mobius_genai.models.families.scales import inverse_logit_scale

_SLIDING = "sliding_attention"

# Cohere's decoder: one LayerNorm without bias feeding attention and MLP, interleaved rope
# (repeat_interleave'd tables, rotate_half on pairs), logits times logit_scale.
_COHERE_BLOCK = {
    "norm_type": "layer_no_bias",
    "parallel_residual": True,  # one shared norm (input_layernorm)
    "mlp_bias": False,
    "logits_scaling": inverse_logit_scale,
    "rope_interleaved": True,
}

COHERE = FamilyAdapter(
    model_type="cohere",
    config_defaults={
        "tie_word_embeddings": True,
        "layer_norm_eps": 1e-5,
        "rope_theta": 500_000.0,  # CohereConfig's default_theta
    },
    config_overrides={
        **_COHERE_BLOCK,
        "qk_norm": switch("use_qk_norm", False),
        "qk_norm_head_weights": switch("use_qk_norm", False),
        "qk_norm_stacked_weights": switch("use_qk_norm", False),
    },
)


def cohere2_window(raw: Mapping[str, Any]) -> int:
    """Cohere2Config's 4096 for an absent window; a null one is refused, as Cohere2Model builds
    its sliding mask from it whatever the layers are (transformers fails on every input)."""
    if "sliding_window" in raw:
        raise UnsupportedModelError(
            "config.json: sliding_window is null; cohere2 models are supported only with a "
            "window (transformers' Cohere2Model cannot run without one)"
        )
    return 4096


def cohere2_no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """Cohere2Attention rotates only in sliding layers: every other layer is NoPE."""
    types = raw["layer_types"]  # the row's default fills it in
    if not isinstance(types, list | tuple):
        return ()  # layer parsing refuses it with its own message
    return tuple(i for i, kind in enumerate(types) if kind != _SLIDING)


COHERE2 = FamilyAdapter(
    model_type="cohere2",
    config_defaults={
        "tie_word_embeddings": True,
        "layer_norm_eps": 1e-5,
        "sliding_window": cohere2_window,
        # every 4th layer full attention (sliding_window_pattern, as Cohere2Config reads it)
        "layer_types": alternating_layer_types(4),
        "bos_token_id": 5,
        "eos_token_id": 255_001,
        "pad_token_id": 0,
    },
    # Cohere2Attention has no q/k norms: use_qk_norm changes nothing
    config_overrides={**_COHERE_BLOCK, "no_rope_layers": cohere2_no_rope_layers},
)

GLM = FamilyAdapter(
    model_type="glm",
    family_keys=READS_PARTIAL_ROTARY,
    # the default "decoder": onnxruntime-genai's "chatglm" is another model
    config_defaults={
        "head_dim": 128,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1.5625e-7,
        "partial_rotary_factor": 0.5,
        "attention_bias": True,
        "eos_token_id": [151329, 151336, 151338],
    },
    config_overrides={"o_bias": False, "mlp_bias": False, "rope_interleaved": True},
    fused_weights=(
        FusedWeight(
            r"\.mlp\.(?P<part>gate|up)_proj\.weight$",
            ".mlp.gate_up_proj.weight",
            ("gate", "up"),
        ),
    ),
)

GLM4 = dataclasses.replace(
    GLM,
    model_type="glm4",
    config_overrides={**GLM.config_overrides, "norm_placement": "sandwich"},
    # the sandwich layer's norms (components/decoder.py) under Glm4DecoderLayer's names
    weight_renames=(
        (r"\.post_attention_layernorm\.", ".post_self_attn_layernorm."),
        (r"\.pre_feedforward_layernorm\.", ".post_attention_layernorm."),
        (r"\.post_feedforward_layernorm\.", ".post_mlp_layernorm."),
    ),
)

COHERE_GLM_FAMILIES = (COHERE, COHERE2, GLM, GLM4)
