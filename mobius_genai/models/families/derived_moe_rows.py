"""MoE rows transformers 5.25 derives from rows we build: each is its parent's row with the
differences its modular file names, as data.

- afmoe (Arcee AFM): sigmoid scores chosen with the correction bias `expert_bias`, renormalized
  and scaled by `route_scale`, beside shared experts, after `num_dense_layers` dense layers;
  sandwich norms; per-head q/k norms, a sigmoid output gate per channel from a projection of
  its own (`gate_proj`, config/attention_gate.py), rotary only in sliding layers; muP's
  embedding scale when `mup_enabled`.
- axk1 (A.X-K1): DeepSeek-V3 (latent attention, always a low-rank q; V3 routing) with the MoE
  block's output through an RMSNorm of its own (`post_mlp_layernorm`, sparse layers only).
- minicpm5_moe (MiniCPM5-MoE): V3 routing where `mlp_layer_types` says, llama attention whose
  q projection also yields each head's output gate (Qwen3.5's [q_h | gate_h]).
- kolibri1 (Kolibri-1): EXAONE 4's attention (per-head q/k norms, NoPE full layers) in GLM-4's
  sandwich layers; every layer MoE, chosen by the router logits plus the correction bias and
  weighted by their sigmoid, beside shared experts.
- flint: Qwen3-MoE's attention with gpt_oss's sinks, rotary only in sliding layers; sigmoid
  top-k routing renormalized, an ungated shared expert, dense `mlp_only_layers`.
- hy_v3 (Hy3): Apertus' attention (per-head q/k norms) in pre-norm layers; sigmoid scores
  chosen with the correction bias, renormalized and scaled by `router_scaling_factor`, beside
  shared experts, dense where `mlp_layer_types` says.

Checkpoint names are the hub's (what transformers' save_pretrained writes back through its
conversion mapping). Keys the config classes fill when absent are the rows' defaults.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.attention_gate import AttentionGate
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.moe_routing import GroupRouting
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.cohere_glm import cohere2_no_rope_layers
from mobius_genai.models.families.deepseek import DEEPSEEK_FAMILIES, sparse_mlp_layers, v3_moe
from mobius_genai.models.families.family_keys import READS_MLP_BIAS, UNBIASED_ATTENTION
from mobius_genai.models.families.float32 import CORRECTED_ROUTER, ROUTER, KeptFloat32
from mobius_genai.models.families.layers import exaone4_no_rope_layers
from mobius_genai.models.families.readers import when_absent

#: The renormalization's epsilon of AFMoE's and Hy3's routers (top_scores.sum() + 1e-20).
_ROUTER_EPSILON = 1e-20
#: MoEBlock's shared_expert is their shared_experts (one MLP of n_shared_experts * width).
_SHARED_EXPERTS = (r"\.mlp\.shared_expert\.", ".mlp.shared_experts.")


def _integer(raw: Mapping[str, Any], key: str, default: int) -> int:
    return fields.integer(raw.get(key), key, default, positive=False)


def _layer_count(raw: Mapping[str, Any]) -> int:
    return fields.require(raw, "num_hidden_layers")


def _afmoe_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """AfmoeConfig without `layer_types`: every `global_attn_every_n_layers`-th layer full."""
    every = fields.integer(raw.get("global_attn_every_n_layers"), "global_attn_every_n_layers", 4)
    return [
        "sliding_attention" if (i + 1) % every else "full_attention"
        for i in range(_layer_count(raw))
    ]


def _afmoe_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Sigmoid scores (of the logits in float32) chosen with `expert_bias`, renormalized and
    times `route_scale`, in the layers from `num_dense_layers` on, beside `num_shared_experts`."""
    keys = MoeKeys(num_experts="num_experts", intermediate="moe_intermediate_size", normalize=True)
    moe = read_moe(raw, keys)
    dense = _integer(raw, "num_dense_layers", 1)
    routing = GroupRouting(
        scoring="sigmoid",
        correction_bias=True,
        scaling=fields.number(raw.get("route_scale"), "route_scale", 1.0, positive=True),
        epsilon=_ROUTER_EPSILON,
        float32_scores=True,
    )
    return dataclasses.replace(
        moe,
        sparse_layers=tuple(i for i in range(_layer_count(raw)) if i >= dense),
        shared_expert_size=moe.intermediate_size * _integer(raw, "num_shared_experts", 2),
        group_routing=routing,
    )


def _mup_embedding_scale(raw: Mapping[str, Any]) -> float:
    """AFMoE's muP: the embeddings times sqrt(hidden_size) when `mup_enabled`."""
    on = fields.flag(raw.get("mup_enabled"), "mup_enabled", False)
    return math.sqrt(fields.require(raw, "hidden_size")) if on else 1.0


def _axk1_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """V3's routing in the layers `mlp_layer_types` calls "sparse" (by default those from
    `first_k_dense_replace` on, every `moe_layer_freq`-th), the block's output normalized."""
    moe = v3_moe({**raw, "first_k_dense_replace": 0})
    num_layers = _layer_count(raw)
    if raw.get("mlp_layer_types") is None:
        dense = _integer(raw, "first_k_dense_replace", 1)
        freq = fields.integer(raw.get("moe_layer_freq"), "moe_layer_freq", 1)
        sparse = tuple(i for i in range(num_layers) if i >= dense and i % freq == 0)
    else:
        sparse = sparse_mlp_layers(raw, 1)
    return dataclasses.replace(moe, sparse_layers=sparse, output_norm=True)


def _axk1_q_lora_rank(raw: Mapping[str, Any]) -> int:
    """A.X-K1's attention always projects q through its low rank (AXK1Attention's q_a_proj)."""
    rank = raw.get("q_lora_rank", 1536)
    if not fields.is_int(rank) or rank <= 0:
        raise UnsupportedModelError(
            f"config.json: q_lora_rank is {rank!r}; axk1 models are supported with a positive "
            "rank (AXK1Attention always projects q through q_a_proj)"
        )
    return rank


def _minicpm5_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """V3's routing in the layers `mlp_layer_types` calls "sparse" (by default all from
    `first_k_dense_replace`, 1, on)."""
    moe = v3_moe({**raw, "first_k_dense_replace": 0})
    dense = _integer(raw, "first_k_dense_replace", 1)
    return dataclasses.replace(moe, sparse_layers=sparse_mlp_layers(raw, dense))


def _minicpm5_gated(raw: Mapping[str, Any]) -> bool:
    """MiniCPM5-MoE's attention always gates its output (its config class refuses
    `use_gated_attention` false, as does this row)."""
    if not fields.flag(raw.get("use_gated_attention"), "use_gated_attention", True):
        raise UnsupportedModelError(
            "config.json: use_gated_attention is False; minicpm5_moe models are supported "
            "only with gated attention (true or absent)"
        )
    return True


def _kolibri1_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Kolibri1Config without `layer_types`: every fifth layer full attention."""
    return [
        "full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
        for i in range(_layer_count(raw))
    ]


def _kolibri1_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Every layer: the experts chosen by their float32 logits plus the correction bias,
    weighted by the sigmoid of their logits (renormalized with `norm_topk_prob`), beside a
    shared expert of `shared_expert_intermediate_size`."""
    keys = MoeKeys(
        num_experts="num_experts",
        intermediate="moe_intermediate_size",
        shared_expert="shared_expert_intermediate_size",
    )
    routing = GroupRouting(
        scoring="sigmoid", correction_bias=True, float32_scores=True, choice_by_logits=True
    )
    return dataclasses.replace(read_moe(raw, keys), group_routing=routing)


def _flint_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Sigmoid scores of the float32 logits, the top-k renormalized (`norm_topk_prob`), an
    ungated shared expert, dense MLPs in `mlp_only_layers` ([0, 1] by default)."""
    keys = MoeKeys(
        num_experts="num_experts",
        intermediate="moe_intermediate_size",
        normalize_default=True,
        sparse_step="decoder_sparse_step",
        dense_layers="mlp_only_layers",
        shared_expert="shared_expert_intermediate_size",
    )
    routing = GroupRouting(scoring="sigmoid", float32_scores=True)
    return dataclasses.replace(read_moe(raw, keys), group_routing=routing)


def _flint_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """FlintConfig without `layer_types`: the first two, every fourth from the second and the
    last layer full attention, the others sliding."""
    last = _layer_count(raw) - 1
    return [
        "full_attention" if i < 2 or i % 4 == 1 or i == last else "sliding_attention"
        for i in range(last + 1)
    ]


def _hy_v3_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Sigmoid scores chosen with the correction bias, renormalized and times
    `router_scaling_factor`, where `mlp_layer_types` says (by default all but the first),
    beside `num_shared_experts` shared experts."""
    keys = MoeKeys(num_experts="num_experts", intermediate="moe_intermediate_size", normalize=True)
    moe = read_moe(raw, keys)
    scaling = fields.number(
        raw.get("router_scaling_factor"), "router_scaling_factor", 2.826, positive=True
    )
    routing = GroupRouting(
        scoring="sigmoid", correction_bias=True, scaling=scaling, epsilon=_ROUTER_EPSILON
    )
    return dataclasses.replace(
        moe,
        sparse_layers=sparse_mlp_layers(raw, 1),
        shared_expert_size=moe.intermediate_size * _integer(raw, "num_shared_experts", 1),
        group_routing=routing,
    )


_DEEPSEEK_V3 = next(row for row in DEEPSEEK_FAMILIES if row.model_type == "deepseek_v3")

DERIVED_MOE_FAMILIES = (
    FamilyAdapter(
        model_type="afmoe",
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "rms_norm_eps": 1e-5,
            "sliding_window": when_absent("sliding_window", 1024),
            "layer_types": _afmoe_layer_types,
            "num_experts": 64,
            "num_experts_per_tok": 6,
            "moe_intermediate_size": 1408,
        },
        config_overrides={
            "mlp_bias": False,
            "norm_placement": "sandwich",
            "qk_norm": True,
            "attention_gate": AttentionGate(activation="sigmoid", per_head=False),
            "no_rope_layers": cohere2_no_rope_layers,
            "embedding_multiplier": _mup_embedding_scale,
            "moe": _afmoe_moe,
        },
        weight_renames=(
            (r"\.pre_feedforward_layernorm\.", ".pre_mlp_layernorm."),
            (r"\.post_feedforward_layernorm\.", ".post_mlp_layernorm."),
            (r"\.self_attn\.g_proj\.", ".self_attn.gate_proj."),
            (r"\.mlp\.gate\.weight$", ".mlp.router.gate.weight"),
            (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.expert_bias"),
            _SHARED_EXPERTS,
        ),
        experts=ExpertLayout(),
        float32=KeptFloat32(strict=("expert_bias",)),
    ),
    dataclasses.replace(
        _DEEPSEEK_V3,
        model_type="axk1",
        config_defaults={
            **_DEEPSEEK_V3.config_defaults,
            "q_lora_rank": _axk1_q_lora_rank,
            "n_routed_experts": 192,
            "first_k_dense_replace": 1,
            "num_key_value_heads": when_absent("num_key_value_heads", 64),
            "max_position_embeddings": 32768,
        },
        config_overrides={**_DEEPSEEK_V3.config_overrides, "moe": _axk1_moe},
        weight_renames=(
            *_DEEPSEEK_V3.weight_renames,
            (r"\.mlp\.post_mlp_layernorm\.", ".post_mlp_layernorm."),
        ),
        unused_weights=(),
    ),
    FamilyAdapter(
        model_type="minicpm5_moe",
        config_aliases={"num_local_experts": "n_routed_experts"},
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "num_key_value_heads": when_absent("num_key_value_heads", 2),
            "rope_theta": 5_000_000.0,  # MiniCPM5MoeConfig's default_theta
            "n_routed_experts": 160,
            "n_shared_experts": 1,
            "moe_intermediate_size": 512,
            "num_experts_per_tok": 16,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 3.66,
            "norm_topk_prob": True,
        },
        # q_proj is [q_h | gate_h] per head (transformers' q_gate_proj); no q/k norms
        config_overrides={"attention_output_gate": _minicpm5_gated, "moe": _minicpm5_moe},
        weight_renames=(_SHARED_EXPERTS,),
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
    ),
    FamilyAdapter(
        model_type="kolibri1",
        # no dense MLP and no intermediate_size: the experts' width stands in for it;
        # transformers 5 writes num_local_experts
        config_aliases={
            "moe_intermediate_size": "intermediate_size",
            "num_local_experts": "num_experts",
        },
        config_defaults={
            "head_dim": 128,
            "num_key_value_heads": when_absent("num_key_value_heads", 4),
            "sliding_window": when_absent("sliding_window", 513),
            "layer_types": _kolibri1_layer_types,
            "num_experts": 384,
            "num_experts_per_tok": 6,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "intermediate_size": 512,
        },
        config_overrides={
            **UNBIASED_ATTENTION,
            "mlp_bias": False,
            "norm_placement": "sandwich",
            "qk_norm": True,
            "no_rope_layers": exaone4_no_rope_layers,
            "moe": _kolibri1_moe,
        },
        # GLM-4's sandwich layer under Kolibri-1's hub names
        weight_renames=(
            (r"\.post_attention_layernorm\.", ".post_attn_norm."),
            (r"\.pre_feedforward_layernorm\.", ".post_attention_layernorm."),
            (r"\.post_feedforward_layernorm\.", ".post_ffn_norm."),
            (r"\.mlp\.gate\.e_score_correction_bias$", ".moe.router.expert_bias"),
            _SHARED_EXPERTS,
        ),
        experts=ExpertLayout(),
        float32=KeptFloat32(strict=("e_score_correction_bias",)),
    ),
    FamilyAdapter(
        model_type="flint",
        config_defaults={
            "head_dim": 128,
            "num_key_value_heads": 4,
            "sliding_window": when_absent("sliding_window", 513),
            "layer_types": _flint_layer_types,
            "mlp_only_layers": [0, 1],
            "num_experts": 256,
            "num_experts_per_tok": 6,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 1024,
            "rms_norm_eps": 1e-6,
        },
        config_overrides={
            "mlp_bias": False,
            "qk_norm": True,
            "attention_sinks": True,
            "no_rope_layers": cohere2_no_rope_layers,
            "moe": _flint_moe,
        },
        weight_renames=((r"\.self_attn\.sinks$", ".self_attn.softmax_offset"),),
        experts=ExpertLayout(),
        float32=ROUTER,  # its sinks are not kept (float32.py)
    ),
    FamilyAdapter(
        model_type="hy_v3",
        family_keys=READS_MLP_BIAS,
        config_defaults={
            "head_dim": 128,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-5,
            "rope_theta": 11_158_840.0,  # HYV3Config's default_theta
            "num_experts": 192,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 1536,
        },
        # the shared experts would take mlp_bias too, which MoEBlock's shared expert has not
        refused_keys=("mlp_bias",),
        config_overrides={"qk_norm": True, "moe": _hy_v3_moe},
        weight_renames=(
            (r"\.mlp\.gate\.weight$", ".mlp.router.gate.weight"),
            (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.expert_bias"),
            (r"\.mlp\.shared_expert\.", ".mlp.shared_mlp."),
        ),
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
        # the multi-token-prediction layer Hy3-preview ships after its 80 layers
        unused_weights=(r"^model\.layers\.80\.",),
    ),
)
