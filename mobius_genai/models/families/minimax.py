"""MiniMax (`minimax`: MiniMax-Text-01, MiniMax-M1 as transformers loads them): lightning
attention layers between softmax attention layers, a MoE MLP in every layer, scaled residuals.

- Layers: `layer_types` ("linear_attention" → lightning attention, components/
  lightning_attention.py, its states declared in config/recurrent.py; "full_attention" → GQA
  with the whole head rotated, as MiniMaxAttention), or the remote code's `attn_type_list`
  (0 linear, 1 full); MiniMaxConfig's default alternates full, linear, ...
- Residuals: each block's residual is its normed input (`residual_after_norm`), added as
  alpha * residual + beta * block with the `{full_attn,linear_attn,mlp}_{alpha,beta}_factor`
  pairs (config/residual_factors.py).
- MLP: Mixtral's block-sparse MoE (softmax router, top-k renormalized), saved by transformers
  5 in Mixtral's layout (`block_sparse_moe.experts.N.w1/w2/w3`).
- The lightning layers' decay buffers in a checkpoint (slope_rate, query_decay, key_decay,
  diagonal_decay) are not read: the slopes follow from the config.
- Refused: a `sliding_window` (transformers would window every softmax layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.lightning_attention import read_lightning_attention
from mobius_genai.config.moe import MoeKeys, moe_reader
from mobius_genai.config.residual_factors import ResidualFactors
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import UNBIASED_ATTENTION
from mobius_genai.models.families.readers import when_absent

#: config.json's layer kinds (layer_types, attn_type_list) → this package's layer types.
_LAYER_TYPES = {"linear_attention": "lightning_attention", "full_attention": "full_attention"}
_ATTN_TYPES = {0: "lightning_attention", 1: "full_attention"}


def minimax_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """`layer_types`, else `attn_type_list`, else MiniMaxConfig's default (full on even layers,
    linear on odd ones)."""
    layers = fields.require(raw, "num_hidden_layers")
    if raw.get("layer_types") is not None:
        key, given, kinds = "layer_types", raw["layer_types"], _LAYER_TYPES
    elif raw.get("attn_type_list") is not None:
        key, given, kinds = "attn_type_list", raw["attn_type_list"], _ATTN_TYPES
    else:
        return tuple(_LAYER_TYPES[_default_kind(i)] for i in range(layers))
    if not isinstance(given, list) or len(given) != layers or any(k not in kinds for k in given):
        raise ConfigError(
            f"config.json: {key} is {given!r}; accepted: one of {list(kinds)} per layer "
            f"({layers} layers)"
        )
    return tuple(kinds[kind] for kind in given)


def _default_kind(index: int) -> str:
    return "full_attention" if (index + 1) % 2 else "linear_attention"


def _factor(raw: Mapping[str, Any], key: str) -> float:
    return fields.number(raw.get(key), key, 1.0)


def read_residual_factors(raw: Mapping[str, Any]) -> ResidualFactors:
    """The three (alpha, beta) pairs; 1 where absent (MiniMaxConfig's defaults)."""
    return ResidualFactors(
        mixers=tuple(
            (kind, _factor(raw, f"{prefix}_alpha_factor"), _factor(raw, f"{prefix}_beta_factor"))
            for kind, prefix in (
                ("full_attention", "full_attn"),
                ("lightning_attention", "linear_attn"),
            )
        ),
        mlp=(_factor(raw, "mlp_alpha_factor"), _factor(raw, "mlp_beta_factor")),
    )


MINIMAX = FamilyAdapter(
    model_type="minimax",
    config_defaults={
        "num_key_value_heads": when_absent("num_key_value_heads", 8),
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096 * 32,
        "rope_theta": 1_000_000.0,  # MiniMaxConfig's default_theta
    },
    config_overrides={
        **UNBIASED_ATTENTION,
        "layer_types": minimax_layer_types,
        "residual_after_norm": True,
        "residual_factors": read_residual_factors,
        "lightning_attention": read_lightning_attention,
        "moe": moe_reader(MoeKeys(num_experts="num_local_experts", normalize=True)),
    },
    weight_renames=(
        (r"\.lightning_attn\.", ".self_attn."),
        (r"\.mlp\.", ".block_sparse_moe."),
    ),
    experts=ExpertLayout(gate="{e}.w1.weight", up="{e}.w3.weight", down="{e}.w2.weight"),
    # transformers would window every softmax layer
    refused_keys=("sliding_window",),
    unused_weights=(r"\.self_attn\.(slope_rate|query_decay|key_decay|diagonal_decay)$",),
)
