"""JetMoE (jetmoe/jetmoe-8b): every layer's attention is a mixture of attention heads
(config/attention_experts.py, components/attention_experts.py) and its MLP a mixture of
experts, both routed by a softmax over the top-k logits of their own router.

The MLP's experts are stored as granitemoe's (`input_linear` [E, 2I, H] = [gate | up],
`output_linear` [E, H, I]) and their weighted sum gets a bias (`mlp.bias`). The attention
experts hold `input_linear` [E, kv_heads * kv_channels, H] (queries) and `output_linear`
[E, H, kv_heads * kv_channels] beside the shared `kv_proj` ([key | value] rows), and a bias on
their sum. The layers' RMSNorms keep RMSNorm's default epsilon 1e-6; only the final norm reads
`rms_norm_eps`. Defaults are JetMoeConfig's; the router's auxiliary loss only trains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.attention_experts import read_attention_experts
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.moe_rows import GRANITE_EXPERTS

#: RMSNorm's default epsilon, which JetMoeDecoderLayer's norms keep.
_LAYER_NORM_EPS = 1e-6


def _query_heads(raw: Mapping[str, Any]) -> int:
    """JetMoeConfig's num_attention_heads: num_key_value_heads * num_experts_per_tok."""
    return fields.require(raw, "num_key_value_heads") * fields.require(raw, "num_experts_per_tok")


def _moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Experts in every layer, the top-k softmax renormalized, a bias on their sum."""
    moe = read_moe(raw, MoeKeys(num_experts="num_local_experts", normalize=True))
    return dataclasses.replace(moe, output_bias=True)


JETMOE = FamilyAdapter(
    model_type="jetmoe",
    config_aliases={"kv_channels": "head_dim", "activation_function": "hidden_act"},
    config_defaults={
        "vocab_size": 32_000,
        "hidden_size": 2048,
        "num_hidden_layers": 12,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "intermediate_size": 5632,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "num_attention_heads": _query_heads,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
    },
    config_overrides={
        "num_attention_heads": _query_heads,
        "qkv_bias": False,
        "o_bias": False,
        "attention_experts": read_attention_experts,
        "moe": _moe,
        "block_norm_eps": _LAYER_NORM_EPS,
    },
    weight_renames=(
        (r"\.self_attn\.", ".self_attention."),
        (r"\.mlp\.gate\.", ".mlp.router.layer."),
        (r"\.mlp\.experts$", ".mlp"),
    ),
    experts=GRANITE_EXPERTS,
)
