"""MoE rows whose router chooses experts by scores plus a learned per-expert
`e_score_correction_bias` and weights them by the uncorrected scores (config/moe_routing.py,
components/group_router.py): GLM-4 MoE (DeepSeek-V3's routing with ordinary attention),
ERNIE-4.5-MoE (softmax scores), MiniMax-M2 (sigmoid scores, one group), dots.llm1
(DeepSeek-V3's routing with Qwen3's attention), K-EXAONE (exaone_moe: V3's routing with
EXAONE 4's attention in pre-norm layers) and Solar Open (solar_open: GLM-4 MoE's routing in
every layer, llama attention without an o_proj bias).

Keys the config classes fill when absent are the rows' defaults, as transformers' config
classes set them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.moe_routing import GroupRouting
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.deepseek import sparse_mlp_layers, v3_moe, v3_routing
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY, UNBIASED_ATTENTION
from mobius_genai.models.families.float32 import CORRECTED_ROUTER
from mobius_genai.models.families.layers import exaone4_layer_types, exaone4_no_rope_layers
from mobius_genai.models.families.readers import switch, when_absent


def _ernie_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Softmax scores, chosen with the correction bias, renormalized; experts in every
    `moe_layer_interval`-th layer from `moe_layer_start_index` to `moe_layer_end_index` (-1:
    the last), beside `moe_num_shared_experts` shared experts."""
    keys = MoeKeys(num_experts="num_experts", intermediate="moe_intermediate_size", normalize=True)
    moe = read_moe(raw, keys)
    num_layers = fields.require(raw, "num_hidden_layers")
    start = fields.integer(
        raw.get("moe_layer_start_index"), "moe_layer_start_index", 1, positive=False
    )
    end = fields.integer(raw.get("moe_layer_end_index"), "moe_layer_end_index", -1, positive=False)
    end = num_layers - 1 if end == -1 else end
    every = fields.integer(raw.get("moe_layer_interval"), "moe_layer_interval", 1)
    shared = fields.integer(
        raw.get("moe_num_shared_experts"), "moe_num_shared_experts", 0, positive=False
    )
    return dataclasses.replace(
        moe,
        sparse_layers=tuple(
            i for i in range(num_layers) if (i + 1) % every == 0 and start <= i <= end
        ),
        shared_expert_size=moe.intermediate_size * shared,
        group_routing=GroupRouting(
            scoring="softmax", correction_bias=True, correction_bias_row=True
        ),
    )


def _minimax_partial_rotary(raw: Mapping[str, Any]) -> float | None:
    """MiniMax-M2's hub configs give the rotated channels as `rotary_dim`."""
    rotary_dim = fields.integer(raw.get("rotary_dim"), "rotary_dim")
    return None if rotary_dim is None else rotary_dim / fields.require(raw, "head_dim")


def _minimax_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Sigmoid scores, chosen with the correction bias, renormalized; experts in every layer.
    MiniMaxM2TopKRouter computes the sigmoid of its logits and the choice in float32."""
    moe = read_moe(raw, MoeKeys(num_experts="num_local_experts", normalize=True))
    routing = GroupRouting(scoring="sigmoid", correction_bias=True, float32_scores=True)
    return dataclasses.replace(moe, group_routing=routing)


def _dots1_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Dots1Config without `layer_types`: with a window, the layers from `max_window_layers`
    (62 by default) on slide."""
    below = fields.integer(raw.get("max_window_layers"), "max_window_layers", 62, positive=False)
    window = raw.get("sliding_window")
    return [
        "sliding_attention" if window is not None and i >= below else "full_attention"
        for i in range(fields.require(raw, "num_hidden_layers"))
    ]


def _exaone_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """V3's routing over `num_experts` in the layers `mlp_layer_types` calls "sparse" (by
    default all from `first_k_dense_replace` on), beside `num_shared_experts` shared ones."""
    moe = read_moe(raw, MoeKeys(num_experts="num_experts", intermediate="moe_intermediate_size"))
    dense = fields.integer(
        raw.get("first_k_dense_replace"), "first_k_dense_replace", 1, positive=False
    )
    shared = fields.integer(raw.get("num_shared_experts"), "num_shared_experts", 1, positive=False)
    return dataclasses.replace(
        moe,
        sparse_layers=sparse_mlp_layers(raw, dense),
        shared_expert_size=moe.intermediate_size * shared,
        group_routing=v3_routing(raw),
    )


# MoEBlock's shared_expert is their shared_experts (one MLP of n_shared_experts * width)
_SHARED_EXPERTS = (r"\.mlp\.shared_expert\.", ".mlp.shared_experts.")

CORRECTED_MOE_FAMILIES = (
    FamilyAdapter(
        model_type="glm4_moe",
        family_keys=READS_PARTIAL_ROTARY,
        config_aliases={"num_local_experts": "n_routed_experts"},
        config_defaults={
            "partial_rotary_factor": 0.5,
            "num_key_value_heads": when_absent("num_key_value_heads", 8),
            "rms_norm_eps": 1e-5,
            "n_routed_experts": 128,
            "n_shared_experts": 1,
            "moe_intermediate_size": 1408,
            "num_experts_per_tok": 8,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": True,
        },
        config_overrides={"qk_norm": switch("use_qk_norm", False), "o_bias": False, "moe": v3_moe},
        weight_renames=(_SHARED_EXPERTS,),
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
        # the multi-token-prediction layer GLM-4.5-Air (46 layers) and GLM-4.5 (92) ship
        unused_weights=(r"^model\.layers\.(46|92)\.",),
    ),
    FamilyAdapter(
        model_type="ernie4_5_moe",
        config_aliases={"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok"},
        config_defaults={
            "num_key_value_heads": when_absent("num_key_value_heads", 4),
            "rms_norm_eps": 1e-5,
            "rope_theta": 500_000.0,  # Ernie4_5_MoeConfig's default_theta
            "tie_word_embeddings": True,
            "num_experts": 64,
            "num_experts_per_tok": 6,
            "moe_intermediate_size": 1536,
            "moe_num_shared_experts": 2,
        },
        # biases would reach the shared experts and the LM head; hub checkpoints have none
        refused_keys=("use_bias",),
        config_overrides={**UNBIASED_ATTENTION, "rope_interleaved": True, "moe": _ernie_moe},
        weight_renames=(
            (r"\.mlp\.gate\.e_score_correction_bias", ".mlp.moe_statics.e_score_correction_bias"),
            _SHARED_EXPERTS,
        ),
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
        # the multi-token-prediction block (transformers ignores every "mtp" tensor)
        unused_weights=(r"mtp",),
    ),
    FamilyAdapter(
        model_type="minimax_m2",
        family_keys=READS_PARTIAL_ROTARY,
        config_aliases={"num_experts": "num_local_experts"},
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "num_key_value_heads": when_absent("num_key_value_heads", 8),
            "rope_theta": 5_000_000.0,  # MiniMaxM2Config's default_theta
            "partial_rotary_factor": _minimax_partial_rotary,
            "num_local_experts": 256,
            "num_experts_per_tok": 8,
            "bos_token_id": 200034,
            "eos_token_id": 200020,
        },
        # RMSNorms over the whole q and k projections
        config_overrides={
            **UNBIASED_ATTENTION,
            "qk_norm": True,
            "qk_norm_per_head": False,
            "moe": _minimax_moe,
        },
        weight_renames=(
            (r"\.mlp\.gate\.e_score_correction_bias", ".block_sparse_moe.e_score_correction_bias"),
            (r"\.mlp\.", ".block_sparse_moe."),
        ),
        experts=ExpertLayout(gate="{e}.w1.weight", up="{e}.w3.weight", down="{e}.w2.weight"),
    ),
    FamilyAdapter(
        model_type="dots1",
        config_aliases={"num_local_experts": "n_routed_experts"},
        config_defaults={
            "sliding_window": when_absent("sliding_window", 4096),
            "layer_types": _dots1_layer_types,
            "num_key_value_heads": when_absent("num_key_value_heads", 32),
            "moe_intermediate_size": when_absent("moe_intermediate_size", 1408),
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 0,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": False,
        },
        # Qwen3's attention: per-head q/k norms, attention_bias on q, k, v and o
        config_overrides={"qk_norm": True, "moe": v3_moe},
        weight_renames=(_SHARED_EXPERTS,),
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
    ),
    FamilyAdapter(
        model_type="exaone_moe",
        config_defaults={
            "num_key_value_heads": 32,
            "rms_norm_eps": 1e-5,
            "sliding_window": when_absent("sliding_window", 4096),
            "num_experts": 64,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 1024,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "n_group": 1,
            "topk_group": 1,
        },
        # Exaone4Attention (per-head q/k norms, rotary only in sliding layers once there is a
        # window) in OlmoeDecoderLayer's pre-norm layers
        config_overrides={
            **UNBIASED_ATTENTION,
            "qk_norm": True,
            "mlp_bias": False,
            "layer_types": exaone4_layer_types,
            "no_rope_layers": exaone4_no_rope_layers,
            "moe": _exaone_moe,
        },
        weight_renames=(
            (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.e_score_correction_bias"),
            _SHARED_EXPERTS,
        ),
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
        # the multi-token-prediction head (_keys_to_ignore_on_load_unexpected)
        unused_weights=(r"^mtp\.",),
    ),
    FamilyAdapter(
        model_type="solar_open",
        # no dense layer and no intermediate_size: the experts' size stands in for it
        config_aliases={
            "num_local_experts": "n_routed_experts",
            "moe_intermediate_size": "intermediate_size",
        },
        config_defaults={
            "head_dim": 128,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1_000_000.0,  # SolarOpenConfig's default_theta
            "n_routed_experts": 128,
            "n_shared_experts": 1,
            "moe_intermediate_size": 1280,
            "num_experts_per_tok": 8,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": True,
        },
        # SolarOpenConfig has no first_k_dense_replace: experts in every layer
        config_overrides={"o_bias": False, "moe": v3_moe},
        weight_renames=(_SHARED_EXPERTS,),
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
    ),
)
