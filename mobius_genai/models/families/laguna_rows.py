"""Laguna and the rows derived from it: sliding and full layers that rotate each by its own
rope (`rope_parameters` per layer type, a partial rotary in each), dense and sparse MLP layers
(`mlp_layer_types`).

Laguna (poolside): per-head q/k RMSNorms, an output gate softplus(x @ g_proj) per head or per
channel (config/attention_gate.py), and in its sparse layers sigmoid routing as MiniMax-M2's
(scores chosen with `e_score_correction_bias`, always renormalized) after a tanh cap on the
router logits, the routed sum times `moe_routed_scaling_factor`, beside an ungated shared MLP.
Mellum (JetBrains): Qwen3-MoE's attention and softmax routing in Laguna's layer layout.
MiMo-V2-Flash (Xiaomi): DeepSeek-V3's routing without shared experts (float32 router), values
narrower than keys and scaled, twice the key/value heads and attention sinks in its sliding
layers (config/head_layout.py), full layers first and every sixth.

Keys the config classes fill when absent are the rows' defaults, as their classes set them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.attention_gate import read_gating
from mobius_genai.config.head_layout import HeadLayout
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.moe_routing import GroupRouting
from mobius_genai.config.rope import RopeConfig, parse_rope
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.deepseek import sparse_mlp_layers, v3_moe
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY
from mobius_genai.models.families.float32 import KeptFloat32
from mobius_genai.models.families.readers import when_absent

#: LagunaConfig's rope when config.json names none: half of each head turns in full layers.
_LAGUNA_ROPE = {
    "full_attention": {
        "rope_type": "default",
        "rope_theta": 500000.0,
        "partial_rotary_factor": 0.5,
    },
    "sliding_attention": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 1.0,
    },
}
#: MellumConfig's: whole heads, each layer type its own base.
_MELLUM_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}


def _full_layers(raw: Mapping[str, Any]) -> list[str]:
    return ["full_attention"] * fields.require(raw, "num_hidden_layers")


def _laguna_heads(raw: Mapping[str, Any]) -> int:
    """`num_attention_heads`, which `num_attention_heads_per_layer` may only repeat: layers with
    their own query head count are refused."""
    heads = fields.require(raw, "num_attention_heads")
    per_layer = raw.get("num_attention_heads_per_layer")
    if per_layer is not None and any(count != heads for count in per_layer):
        raise UnsupportedModelError(
            f"config.json: num_attention_heads_per_layer is {per_layer!r}; laguna models are "
            f"supported only with num_attention_heads ({heads}) in every layer"
        )
    return heads


def _laguna_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Sigmoid scores of the capped logits (float32), chosen with the correction bias,
    renormalized and scaled, in the layers `mlp_layer_types` calls "sparse" (by default all
    but the first), beside a shared MLP of `shared_expert_intermediate_size`."""
    keys = MoeKeys(
        num_experts="num_experts",
        intermediate="moe_intermediate_size",
        normalize=True,
        shared_expert="shared_expert_intermediate_size",
    )
    moe = read_moe(raw, keys)
    cap_key, scale_key = "moe_router_logit_softcapping", "moe_routed_scaling_factor"
    routing = GroupRouting(
        scoring="sigmoid",
        correction_bias=True,
        float32_scores=True,
        scaling=fields.number(raw.get(scale_key), scale_key, 1.0),
        logit_softcap=fields.number(raw.get(cap_key), cap_key, 0.0),
    )
    return dataclasses.replace(moe, sparse_layers=sparse_mlp_layers(raw, 1), group_routing=routing)


def _mellum_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Qwen3-MoE's softmax routing in the layers `mlp_layer_types` calls "sparse" (by default
    every layer)."""
    keys = MoeKeys(num_experts="num_experts", intermediate="moe_intermediate_size")
    moe = read_moe(raw, dataclasses.replace(keys, normalize_default=True))
    return dataclasses.replace(moe, sparse_layers=sparse_mlp_layers(raw, 0))


# the hub's names, which save_pretrained writes too (transformers' conversion mapping, reversed):
# the correction bias beside the experts
_LAGUNA_RENAMES = (
    (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.experts.e_score_correction_bias"),
)

LAGUNA = FamilyAdapter(
    model_type="laguna",
    family_keys=READS_PARTIAL_ROTARY,
    refused_keys=("moe_apply_router_weight_on_input",),
    config_aliases={"num_local_experts": "num_experts"},
    config_defaults={
        "vocab_size": 100352,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 40,
        "num_attention_heads": 48,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "sliding_window": 512,
        "layer_types": _full_layers,
        "rope_parameters": _LAGUNA_ROPE,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
    },
    config_overrides={
        "num_attention_heads": _laguna_heads,
        "qk_norm": True,
        "attention_gate": lambda raw: read_gating(raw.get("gating", True), "laguna"),
        "moe": _laguna_moe,
    },
    weight_renames=_LAGUNA_RENAMES,
    experts=ExpertLayout(),
)

MELLUM = FamilyAdapter(
    model_type="mellum",
    family_keys=READS_PARTIAL_ROTARY,
    config_aliases={"num_local_experts": "num_experts"},
    config_defaults={
        "vocab_size": 98304,
        "hidden_size": 2304,
        "intermediate_size": 7168,
        "num_hidden_layers": 28,
        "num_attention_heads": 32,
        "num_key_value_heads": when_absent("num_key_value_heads", 4),
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "sliding_window": when_absent("sliding_window", 1024),
        "layer_types": _full_layers,
        "rope_parameters": _MELLUM_ROPE,
        "num_experts": 64,
        "moe_intermediate_size": 896,
    },
    config_overrides={"qk_norm": True, "moe": _mellum_moe},
    experts=ExpertLayout(),
    # the multi-token-prediction layer (_keys_to_ignore_on_load_unexpected)
    unused_weights=(r"^mtp\.",),
)

_MIMO_PARTIAL_ROTARY = 0.334  # MiMoV2FlashRotaryEmbedding's, where a rope entry names none
_MIMO_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
}


def _mimo_rope_parameters(raw: Mapping[str, Any]) -> dict[str, Any]:
    """MiMoV2FlashConfig's per-type rope, each entry turning 0.334 of each head unless it says."""
    given = fields.mapping(raw.get("rope_parameters"), "rope_parameters") or _MIMO_ROPE
    return {
        kind: {"partial_rotary_factor": _MIMO_PARTIAL_ROTARY, **entry}
        if isinstance(entry, Mapping)
        else entry
        for kind, entry in given.items()
    }


def _mimo_ropes(raw: Mapping[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    return parse_rope({**raw, "rope_parameters": _mimo_rope_parameters(raw)})


def _mimo_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Full attention in the first layer and every sixth, sliding in the others."""
    return [
        "full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention"
        for i in range(fields.require(raw, "num_hidden_layers"))
    ]


def _mimo_kv_heads(raw: Mapping[str, Any]) -> int:
    """The cache's key/value heads: the sliding layers' (twice the full layers'), where any."""
    heads = fields.require(raw, "num_key_value_heads")
    return 2 * heads if "sliding_attention" in raw["layer_types"] else heads


def _mimo_head_layout(raw: Mapping[str, Any]) -> HeadLayout:
    heads = fields.require(raw, "num_key_value_heads")
    scale = fields.number(raw.get("attention_value_scale"), "attention_value_scale", 1.0)
    return HeadLayout(
        v_head_dim=fields.require(raw, "v_head_dim"),
        value_scale=scale,
        kv_heads=tuple(
            2 * heads if k == "sliding_attention" else heads for k in raw["layer_types"]
        ),
        sink_layer_types=("sliding_attention",),
    )


def _mimo_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """DeepSeek-V3's routing in the layers `mlp_layer_types` calls "sparse" (by default all
    but the first), without shared experts."""
    return dataclasses.replace(
        v3_moe(raw), sparse_layers=sparse_mlp_layers(raw, 1), shared_expert_size=0
    )


MIMO_V2_FLASH = FamilyAdapter(
    model_type="mimo_v2_flash",
    family_keys=READS_PARTIAL_ROTARY,
    config_aliases={"num_local_experts": "n_routed_experts"},
    config_defaults={
        "vocab_size": 152576,
        "hidden_size": 4096,
        "intermediate_size": 16384,
        "num_hidden_layers": 48,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 192,
        "v_head_dim": 128,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "sliding_window": 129,
        "layer_types": _mimo_layer_types,
        "rope_parameters": _mimo_rope_parameters,
        # an explicit null scales nothing (MiMoV2FlashAttention's v_scale 1.0)
        "attention_value_scale": when_absent("attention_value_scale", 0.707),
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
    },
    config_overrides={
        "rope": lambda raw: _mimo_ropes(raw)[0],
        "rope_local": lambda raw: _mimo_ropes(raw)[1],
        "num_key_value_heads": _mimo_kv_heads,
        "o_bias": False,
        "attention_sinks": True,
        "head_layout": _mimo_head_layout,
        "moe": _mimo_moe,
    },
    weight_renames=((r"\.self_attn\.sinks$", ".self_attn.attention_sink_bias"),),
    experts=ExpertLayout(),
    # MiMoV2FlashPreTrainedModel's _keep_in_fp32_modules_strict
    float32=KeptFloat32(strict=("e_score_correction_bias", "mlp.gate.weight")),
    # the multi-token-prediction layers (_keys_to_ignore_on_load_unexpected)
    unused_weights=(r"^model\.mtp\.",),
)

LAGUNA_FAMILIES = (LAGUNA, MELLUM, MIMO_V2_FLASH)
