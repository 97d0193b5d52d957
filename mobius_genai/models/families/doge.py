"""Doge (SmallDoge/Doge-20M ... Doge-320M): llama's layout with Doge's dynamic mask attention
(config/dynamic_mask.py, components/dynamic_mask.py: a bias per key from its value states
through `A` and `dt_proj`), per-head q/k RMSNorms before the rotary, and learned vectors
scaling each layer's two residuals (`input_residual`, `post_attention_residual`).

Refused in one line: `is_moe` (the cross-domain MoE, CDMoE: transformers splits its router's
logits with a view that mixes the tokens of a prefill) and `sliding_window` (every layer
windowed besides the dynamic mask). Defaults are DogeConfig's.
"""

from __future__ import annotations

from mobius_genai.config.dynamic_mask import read_dynamic_mask
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_MLP_BIAS

DOGE = FamilyAdapter(
    model_type="doge",
    family_keys=READS_MLP_BIAS,
    config_defaults={
        "vocab_size": 32_768,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 32,
        "num_attention_heads": 8,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
    },
    config_overrides={
        "qk_norm": True,
        "dynamic_mask": read_dynamic_mask,
        "residual_scales": True,
    },
    refused_keys=("is_moe", "sliding_window"),
)
