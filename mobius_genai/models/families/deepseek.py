"""DeepSeek-V2 and V3: multi-head latent attention (config/latent_attention.py) and MoE layers
with shared experts and group-limited routing (config/moe_routing.py) after dense first layers;
GLM-4.7-Flash (glm4_moe_lite): V3's attention and routing, its MoE layers where
`mlp_layer_types` says "sparse"; MiniCPM3 (minicpm3) and Youtu-LLM (youtu): the latent
attention in a dense decoder; DeepSeek-V3.2 (deepseek_v32) and GLM-5 (glm_moe_dsa):
GLM-4.7-Flash's layout with DeepSeek sparse attention, a lightning indexer in every layer
(config/sparse_indexer.py).

transformers writes `head_dim` as the rope slice (qk_rope_head_dim), hub configs leave it out;
the graph's head_dim is the latent cache's head size either way, with one key/value head. Keys the config classes fill when
absent are the rows' defaults, as transformers' DeepseekV2Config / DeepseekV3Config set them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.latent_attention import read_latent_attention
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.moe_routing import GroupRouting
from mobius_genai.config.rope import RopeConfig, parse_rope, yarn_mscale
from mobius_genai.config.sparse_indexer import read_indexer
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_MLP_BIAS, READS_PARTIAL_ROTARY
from mobius_genai.models.families.float32 import CORRECTED_ROUTER, ROUTER, KeptFloat32
from mobius_genai.models.families.readers import positive_number, switch, when_absent

# V2's topk_method → whether it limits the groups (transformers' DeepseekV2TopkRouter)
_V2_TOPK_METHODS = {"greedy": False, "group_limited_greedy": True}


def _latent_defaults(q_lora_rank: int) -> dict[str, Any]:
    return {
        "q_lora_rank": when_absent("q_lora_rank", q_lora_rank),  # null: one q_proj
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }


def _cache_head_dim(raw: Mapping[str, Any]) -> int:
    return read_latent_attention(raw).cache_head_dim


def _scale(raw: Mapping[str, Any]) -> float:
    """qk_head_dim**-0.5, times yarn's mscale(factor, mscale_all_dim) squared for a scaled rope
    (transformers' yarn_apply_mscale): the nope channels are scaled as the rotated ones."""
    scale = read_latent_attention(raw).qk_head_dim ** -0.5
    rope, _ = parse_rope(raw)
    if rope.type != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


def _moe(raw: Mapping[str, Any], routing: GroupRouting, normalize: str | bool) -> MoeConfig:
    keys = MoeKeys(
        num_experts="n_routed_experts",
        intermediate="moe_intermediate_size",
        normalize=normalize,
    )
    moe = read_moe(raw, keys)
    dense = fields.integer(
        raw.get("first_k_dense_replace"), "first_k_dense_replace", 0, positive=False
    )
    shared = fields.integer(raw.get("n_shared_experts"), "n_shared_experts", 0, positive=False)
    return dataclasses.replace(
        moe,
        sparse_layers=tuple(i for i in moe.sparse_layers if i >= dense),
        shared_expert_size=moe.intermediate_size * shared,
        group_routing=routing,
    )


def _scaling(raw: Mapping[str, Any]) -> float:
    key = "routed_scaling_factor"
    return fields.number(raw.get(key), key, 1.0, positive=True)


def v3_routing(raw: Mapping[str, Any]) -> GroupRouting:
    """Sigmoid scores, corrected by e_score_correction_bias for the choice; groups scored by
    the sum of their best two (also Nemotron-H's NemotronHTopkRouter)."""
    return GroupRouting(
        scoring="sigmoid",
        groups=fields.require(raw, "n_group"),
        top_groups=fields.require(raw, "topk_group"),
        group_score="top2_sum",
        correction_bias=True,
        scaling=_scaling(raw),
    )


def v3_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """DeepSeek-V3's routing (v3_routing) after the dense first layers."""
    return _moe(raw, v3_routing(raw), "norm_topk_prob")


def sparse_mlp_layers(raw: Mapping[str, Any], dense_first: int) -> tuple[int, ...]:
    """The layers `mlp_layer_types` calls "sparse" (MoE) rather than "dense"; without it, all
    but the first `dense_first` (GLM-4.7-Flash's and K-EXAONE's config classes fill it so)."""
    num_layers = fields.require(raw, "num_hidden_layers")
    kinds = raw.get("mlp_layer_types")
    if kinds is None:
        kinds = ["dense" if i < dense_first else "sparse" for i in range(num_layers)]
    if (
        not isinstance(kinds, list)
        or len(kinds) != num_layers
        or not set(kinds) <= {"dense", "sparse"}
    ):
        raise ConfigError(
            f"config.json: mlp_layer_types is {kinds!r}; accepted: a list of 'dense' or "
            f"'sparse', one per layer ({num_layers})"
        )
    return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")


def _glm4_moe_lite_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """V3's routing in the layers `mlp_layer_types` calls "sparse" (by default every layer but
    the first), dense MLPs in the others."""
    return dataclasses.replace(v3_moe(raw), sparse_layers=sparse_mlp_layers(raw, 1))


def _whole_rope_slice(raw: Mapping[str, Any]) -> RopeConfig:
    """The rope of Glm4MoeLiteRotaryEmbedding, which turns `partial_rotary_factor` of the
    rope slice (qk_rope_head_dim): the whole slice (the config class's default) is what the
    latent attention rotates."""
    rope, _ = parse_rope(raw)
    if rope.partial_rotary_factor != 1.0:
        raise UnsupportedModelError(
            f"config.json: partial_rotary_factor is {rope.partial_rotary_factor}; latent "
            "attention models are supported with the whole rope slice rotated (1.0)"
        )
    return rope


def v2_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Softmax scores, never renormalized; `group_limited_greedy` keeps the groups whose best
    expert scores highest."""
    method = raw.get("topk_method")
    if method not in _V2_TOPK_METHODS:
        raise UnsupportedModelError(
            f"config.json: topk_method is {method!r}; deepseek_v2 models are supported with "
            f"{sorted(_V2_TOPK_METHODS)}"
        )
    groups = (
        {"groups": fields.require(raw, "n_group"), "top_groups": fields.require(raw, "topk_group")}
        if _V2_TOPK_METHODS[method]
        else {}
    )
    routing = GroupRouting(scoring="softmax", scaling=_scaling(raw), **groups)
    return _moe(raw, routing, False)


_LATENT = {
    "latent_attention": read_latent_attention,
    "head_dim": _cache_head_dim,
    "num_key_value_heads": 1,  # the latent cache: one head every query head reads
    "attention_scale": _scale,
}


def _overrides(moe: Callable[[Mapping[str, Any]], MoeConfig]) -> dict[str, Any]:
    return {**_LATENT, "moe": moe}


def _dsa_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """V3's routing in the layers `mlp_layer_types` calls "sparse", by default all but the
    first `first_k_dense_replace` (DeepseekV32Config's)."""
    dense = fields.integer(
        raw.get("first_k_dense_replace"), "first_k_dense_replace", 0, positive=False
    )
    return dataclasses.replace(v3_moe(raw), sparse_layers=sparse_mlp_layers(raw, dense))


def _indexed_layers(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Every layer attends with the indexer ("indexed_attention", the config classes' only
    layer type): full attention with the indexer's mask."""
    layers = fields.require(raw, "num_hidden_layers")
    types = raw.get("layer_types")
    if types is not None and types != ["indexed_attention"] * layers:
        raise UnsupportedModelError(
            f"config.json: layer_types is {types!r}; accepted: 'indexed_attention' in each of "
            f"the {layers} layers"
        )
    return ("full_attention",) * layers


def _sparse_attention(indexer_interleaved: bool) -> dict[str, Any]:
    """The latent attention with a lightning indexer whose rope slice turns pairs or halves;
    the attention's own rope always turns pairs (these classes have no rope_interleave)."""

    def latent(raw: Mapping[str, Any]):
        indexer = read_indexer(raw, indexer_interleaved)
        return dataclasses.replace(read_latent_attention(raw), indexer=indexer)

    return {
        **_overrides(_dsa_moe),
        "latent_attention": latent,
        "head_dim": lambda raw: latent(raw).cache_head_dim,
        "layer_types": _indexed_layers,
        "rope": _whole_rope_slice,
        "rope_interleaved": True,
    }


def _dsa_defaults(q_lora_rank: int, index_heads: int) -> dict[str, Any]:
    """DeepseekV32Config's defaults shared by GlmMoeDsaConfig."""
    return {
        **_latent_defaults(q_lora_rank),
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "moe_intermediate_size": 2048,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "index_topk": 2048,
        "index_head_dim": 128,
        "index_n_heads": index_heads,
    }


#: V3's router, and the indexer's head weights in float16 models (`_keep_in_fp32_modules`)
_DSA_FLOAT32 = KeptFloat32(strict=CORRECTED_ROUTER.strict, in_float16=("indexer.weights_proj",))


def _minicpm3_depth(raw: Mapping[str, Any]) -> float:
    """MiniCPM3Config: 1.4 when scale_depth is absent, sqrt(num_hidden_layers) when null (a
    residual multiplier of 1)."""
    layers = fields.require(raw, "num_hidden_layers")
    return 1.4 if "scale_depth" not in raw else math.sqrt(layers)


def _minicpm3_residual(raw: Mapping[str, Any]) -> float:
    """Each block's output times scale_depth / sqrt(num_hidden_layers)."""
    depth = fields.number(raw.get("scale_depth"), "scale_depth", positive=True)
    return depth / math.sqrt(fields.require(raw, "num_hidden_layers"))


def _minicpm3_logits(raw: Mapping[str, Any]) -> float:
    """The final hidden states divided by hidden_size / dim_model_base before the head."""
    base = fields.integer(raw.get("dim_model_base"), "dim_model_base")
    return fields.require(raw, "hidden_size") / base


def _default_to_hidden(key: str, absent: int) -> Callable[[Mapping[str, Any]], int]:
    """MiniCPM3Config's `absent` when `key` is absent, hidden_size when null."""
    return lambda raw: absent if key not in raw else fields.require(raw, "hidden_size")


# MoEBlock's shared_expert is DeepSeek's shared_experts (one MLP of n_shared_experts * width)
_RENAMES = ((r"\.mlp\.shared_expert\.", ".mlp.shared_experts."),)
# the indexer's key projection and norm, a module of their own (components/sparse_indexer.py)
_DSA_RENAMES = (*_RENAMES, (r"\.self_attn\.indexer_key\.", ".self_attn.indexer."))

DEEPSEEK_FAMILIES = (
    FamilyAdapter(
        model_type="deepseek_v3",
        config_aliases={"num_local_experts": "n_routed_experts"},
        config_defaults={
            **_latent_defaults(1536),
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "moe_intermediate_size": 2048,
            "num_experts_per_tok": 8,
            "n_group": 8,
            "topk_group": 4,
            "first_k_dense_replace": 3,
            "routed_scaling_factor": 2.5,
            "norm_topk_prob": True,
        },
        config_overrides={
            **_overrides(v3_moe),
            # pairs (x0, x1), (x2, x3), ... as transformers' rope_interleave (its default)
            "rope_interleaved": switch("rope_interleave", True),
        },
        weight_renames=_RENAMES,
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
        # the multi-token-prediction layer DeepSeek-V3 ships after its 61 layers
        unused_weights=(r"^model\.layers\.61\.",),
    ),
    FamilyAdapter(
        model_type="deepseek_v2",
        family_keys=READS_MLP_BIAS,
        config_aliases={"num_experts": "n_routed_experts"},
        config_defaults={
            **_latent_defaults(1536),
            "n_routed_experts": 64,
            "n_shared_experts": 2,
            "moe_intermediate_size": 1407,
            "topk_method": "greedy",
            "first_k_dense_replace": 0,
            "routed_scaling_factor": 1.0,
        },
        # the shared experts' MLP would take mlp_bias; the routed experts never do
        refused_keys=("mlp_bias",),
        # rotates pairs (x0, x1), (x2, x3), ... as complex numbers
        config_overrides={**_overrides(v2_moe), "rope_interleaved": True},
        weight_renames=_RENAMES,
        experts=ExpertLayout(),
        float32=ROUTER,
    ),
    FamilyAdapter(
        model_type="glm4_moe_lite",
        family_keys=READS_PARTIAL_ROTARY,
        config_aliases={"num_local_experts": "n_routed_experts"},
        config_defaults={
            **_latent_defaults(768),
            "qk_nope_head_dim": 192,
            "v_head_dim": 256,
            "rms_norm_eps": 1e-5,
            "n_routed_experts": 64,
            "n_shared_experts": 1,
            "moe_intermediate_size": 1536,
            "num_experts_per_tok": 4,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.8,
            "norm_topk_prob": True,
        },
        config_overrides={
            **_overrides(_glm4_moe_lite_moe),
            "rope": _whole_rope_slice,
            "rope_interleaved": switch("rope_interleave", True),
        },
        weight_renames=_RENAMES,
        experts=ExpertLayout(),
        float32=CORRECTED_ROUTER,
        # the multi-token-prediction layer GLM-4.7-Flash ships after its 47 layers
        unused_weights=(r"^model\.layers\.47\.",),
    ),
    # DeepSeek-V3.2: the indexer's rope slice turns halves, the attention's pairs
    FamilyAdapter(
        model_type="deepseek_v32",
        config_aliases={"num_local_experts": "n_routed_experts"},
        config_defaults={**_dsa_defaults(1536, 64), "n_group": 8, "topk_group": 4},
        config_overrides=_sparse_attention(indexer_interleaved=False),
        weight_renames=_DSA_RENAMES,
        experts=ExpertLayout(),
        float32=_DSA_FLOAT32,
        # the multi-token-prediction layer DeepSeek-V3.2 ships after its 61 layers
        unused_weights=(r"^model\.layers\.61\.",),
    ),
    # GLM-5: V3.2's layers, the indexer's rope slice turning pairs
    FamilyAdapter(
        model_type="glm_moe_dsa",
        config_aliases={"num_local_experts": "n_routed_experts"},
        config_defaults={
            **_dsa_defaults(2048, 32),
            "qk_nope_head_dim": 192,
            "v_head_dim": 256,
            "rms_norm_eps": 1e-5,
            "n_group": 1,
            "topk_group": 1,
        },
        config_overrides=_sparse_attention(indexer_interleaved=True),
        weight_renames=_DSA_RENAMES,
        experts=ExpertLayout(),
        float32=_DSA_FLOAT32,
        # the multi-token-prediction layer GLM-5 ships after its 78 layers
        unused_weights=(r"^model\.layers\.78\.",),
    ),
    # Youtu-LLM: V3's latent attention (low-rank q, interleaved rope slice) in llama's
    # decoder with dense SwiGLU MLPs, as YoutuForCausalLM builds it
    FamilyAdapter(
        model_type="youtu",
        config_defaults={
            **_latent_defaults(1536),
            "num_key_value_heads": 16,
            "max_position_embeddings": 131_072,
            "tie_word_embeddings": True,
        },
        config_overrides={
            **_LATENT,
            "mlp_bias": False,
            "rope_interleaved": switch("rope_interleave", True),
        },
    ),
    # MiniCPM3-4B: V2's latent attention (rotating its rope slice's halves, as llama does) in a
    # dense decoder, with MiniCPM's embedding, residual and logit scales
    FamilyAdapter(
        model_type="minicpm3",
        family_keys=READS_MLP_BIAS,
        config_defaults={
            **_latent_defaults(768),
            "kv_lora_rank": 256,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": lambda raw: (
                fields.require(raw, "hidden_size") // fields.require(raw, "num_attention_heads")
            ),
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
            "scale_emb": 12,
            "scale_depth": _minicpm3_depth,
            "dim_model_base": _default_to_hidden("dim_model_base", 256),
        },
        config_overrides={
            **_LATENT,
            "embedding_multiplier": positive_number("scale_emb"),
            "residual_multiplier": _minicpm3_residual,
            "logits_scaling": _minicpm3_logits,
        },
    ),
)
