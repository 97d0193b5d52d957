"""Cohere2-MoE: cohere2's row (cohere_glm.py: one norm feeding attention and MLP side by side,
interleaved rotary, logits times logit_scale, sliding layers) with what transformers'
Cohere2Moe classes change.

- MLP layers: `mlp_layer_types` "dense" (a gated MLP of `prefix_dense_intermediate_size`) or
  "sparse" (experts of `intermediate_size`); by default the first `first_k_dense_replace`
  layers are dense.
- Routing (Cohere2MoeTopKRouter): the top-k router logits, their softmax (the top-k of the
  softmax renormalized) or, with `expert_selection_fn` "sigmoid", their sigmoids, renormalized
  with `norm_topk_prob`.
- `num_shared_experts`: one MLP `num_shared_experts` experts wide beside them, summed with the
  routed output or, with `shared_expert_combination_strategy` "average", averaged.
- Rotary: sliding layers rotate as in cohere2, and so do the dense layers where
  `prefix_dense_sliding_window_pattern` is 1 (Cohere2MoeAttention's force_rope).
- Norms: RMSNorms where `rms_norm_eps` is set, else cohere's LayerNorm without bias.
- Defaults: Cohere2MoeConfig's (head_dim 128, as many key/value heads as heads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.moe_routing import GroupRouting
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.cohere_glm import COHERE2, cohere2_window
from mobius_genai.models.families.heads import kv_head_per_head
from mobius_genai.models.families.readers import when_absent

_SLIDING = "sliding_attention"
_SELECTIONS = ("softmax", "sigmoid")
_COMBINATIONS = {"sum": 1.0, "average": 0.5}


def _dense_prefix(raw: Mapping[str, Any]) -> int:
    """Cohere2MoeConfig's first_k_dense_replace (an init argument it does not keep)."""
    return fields.integer(
        raw.get("first_k_dense_replace"), "first_k_dense_replace", 0, positive=False
    )


def _layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Each pattern's every n-th layer full, the others sliding: the dense prefix by
    prefix_dense_sliding_window_pattern, the layers after it by sliding_window_pattern."""
    prefix = _dense_prefix(raw)
    first = _pattern(raw, "prefix_dense_sliding_window_pattern", 1)
    rest = _pattern(raw, "sliding_window_pattern", 4)
    layers = fields.require(raw, "num_hidden_layers")
    return [_SLIDING if (i + 1) % first else "full_attention" for i in range(prefix)] + [
        _SLIDING if (i + 1) % rest else "full_attention" for i in range(layers - prefix)
    ]


def _pattern(raw: Mapping[str, Any], key: str, default: int) -> int:
    return fields.integer(raw.get(key), key, default)


def _mlp_layer_types(raw: Mapping[str, Any]) -> list[str]:
    prefix = _dense_prefix(raw)
    return [
        "dense" if i < prefix else "sparse" for i in range(fields.require(raw, "num_hidden_layers"))
    ]


def _sparse_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    kinds = raw["mlp_layer_types"]  # the row's default fills it in
    layers = fields.require(raw, "num_hidden_layers")
    if (
        not isinstance(kinds, list | tuple)
        or len(kinds) != layers
        or set(kinds) - {"dense", "sparse"}
    ):
        raise ConfigError(
            f"config.json: field 'mlp_layer_types' is {kinds!r}; accepted: a list of "
            f"{layers} entries, each 'dense' or 'sparse'"
        )
    return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")


def _choice(raw: Mapping[str, Any], key: str, accepted: Any, default: str) -> str:
    value = raw.get(key, default)
    if value not in accepted:
        raise ConfigError(f"config.json: field {key!r} is {value!r}; accepted: {list(accepted)}")
    return value


def cohere2_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Cohere2MoeSparseMoeBlock's routing, shared experts and layers (see the module
    docstring)."""
    sigmoid = _choice(raw, "expert_selection_fn", _SELECTIONS, "softmax") == "sigmoid"
    normalize = not sigmoid or fields.flag(raw.get("norm_topk_prob"), "norm_topk_prob", True)
    moe = read_moe(raw, MoeKeys(num_experts="num_experts", normalize=normalize))
    shared = fields.integer(raw.get("num_shared_experts"), "num_shared_experts", 0, positive=False)
    strategy = "shared_expert_combination_strategy"
    scale = _COMBINATIONS[_choice(raw, strategy, _COMBINATIONS, "average")] if shared else 1.0
    return dataclasses.replace(
        moe,
        sparse_layers=_sparse_layers(raw),
        shared_expert_size=moe.intermediate_size * shared,
        combined_scale=scale,
        group_routing=GroupRouting(scoring="sigmoid") if sigmoid else None,
    )


def _dense_width(raw: Mapping[str, Any]) -> int:
    """The dense layers' MLP width (intermediate_size is the experts')."""
    width = raw.get("prefix_dense_intermediate_size")
    return fields.require(
        raw, "intermediate_size" if width is None else "prefix_dense_intermediate_size"
    )


def _no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """Full-attention layers are NoPE, but dense ones where the prefix pattern is 1."""
    forced = _pattern(raw, "prefix_dense_sliding_window_pattern", 1) == 1
    types, kinds = raw["layer_types"], raw["mlp_layer_types"]
    if not isinstance(types, list | tuple) or not isinstance(kinds, list | tuple):
        return ()  # layer parsing refuses them with its own message
    return tuple(
        i
        for i, (kind, mlp) in enumerate(zip(types, kinds, strict=False))
        if kind != _SLIDING and not (forced and mlp == "dense")
    )


def _norm_type(raw: Mapping[str, Any]) -> str:
    return "layer_no_bias" if raw.get("rms_norm_eps") is None else "rms"


COHERE2_MOE = dataclasses.replace(
    COHERE2,
    model_type="cohere2_moe",
    config_defaults={
        **COHERE2.config_defaults,
        "head_dim": when_absent("head_dim", 128),
        "num_key_value_heads": kv_head_per_head,
        "sliding_window": cohere2_window,
        "layer_types": _layer_types,
        "mlp_layer_types": _mlp_layer_types,
        "num_experts": 8,
        "num_experts_per_tok": 2,
    },
    config_overrides={
        **COHERE2.config_overrides,
        "norm_type": _norm_type,
        "intermediate_size": _dense_width,
        "no_rope_layers": _no_rope_layers,
        "moe": cohere2_moe,
    },
    weight_renames=((r"\.mlp\.shared_expert\.", ".mlp.shared_experts."),),
    experts=ExpertLayout(),
)
