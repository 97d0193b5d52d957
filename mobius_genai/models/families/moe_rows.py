"""The mixture-of-experts rows of the family table (config/moe.py, components/moe.py).

onnxruntime-genai runs these on its generic decoder path; `experts` says where each family's
checkpoint keeps the expert matrices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.moe import MoeConfig, MoeKeys, moe_reader, read_moe
from mobius_genai.models.families.adapter import FamilyAdapter, FusedWeight
from mobius_genai.models.families.cohere2_moe import COHERE2_MOE
from mobius_genai.models.families.dbrx import DBRX
from mobius_genai.models.families.family_keys import READS_SLIDING_SWITCH, UNBIASED_ATTENTION
from mobius_genai.models.families.hunyuan_moe import HUNYUAN_ROUTER, hunyuan_moe
from mobius_genai.models.families.layers import every_layer_windowed, qwen2_moe_layer_types
from mobius_genai.models.families.readers import switch, when_absent
from mobius_genai.models.families.rope import ntk_alpha_rope
from mobius_genai.models.families.scales import GRANITE_MULTIPLIERS

# qwen2_moe / qwen3_moe: expert size and the dense layers (mlp_only_layers, decoder_sparse_step)
_QWEN_MOE = MoeKeys(
    num_experts="num_experts",
    intermediate="moe_intermediate_size",
    sparse_step="decoder_sparse_step",
    dense_layers="mlp_only_layers",
)

#: granitemoe's router and experts, under block_sparse_moe (input_linear [gate | up] and
#: output_linear stacked over the experts)
_GRANITE_MOE_RENAMES = (
    (r"\.mlp\.gate\.", ".block_sparse_moe.router.layer."),
    (r"\.mlp\.experts$", ".block_sparse_moe"),
)
GRANITE_EXPERTS = ExpertLayout(gate="input_linear.weight", up=None, down="output_linear.weight")
#: granitemoeshared's shared MLP beside the experts, and granitemoehybrid's (or its dense MLP,
#: in the layouts without experts): shared_mlp, input_linear [gate | up] and output_linear
GRANITE_SHARED_MLP_RENAMES = (
    *_GRANITE_MOE_RENAMES,
    (r"\.mlp\.(shared_expert\.)?down_proj\.", ".shared_mlp.output_linear."),
)
GRANITE_SHARED_MLP_FUSED = (
    FusedWeight(
        r"\.mlp\.(shared_expert\.)?(?P<part>gate|up)_proj\.weight$",
        ".shared_mlp.input_linear.weight",
        ("gate", "up"),
    ),
)


def _aria_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Aria's MoE in every layer: a softmax over the top-k router logits (the top-k
    probabilities renormalized) beside `moe_num_shared_experts` shared experts, one MLP of
    that many times intermediate_size."""
    moe = read_moe(raw, MoeKeys(num_experts="moe_num_experts", top_k="moe_topk", normalize=True))
    key = "moe_num_shared_experts"
    shared = fields.integer(raw.get(key), key, 2, positive=False)
    return dataclasses.replace(moe, shared_expert_size=moe.intermediate_size * shared)


MOE_FAMILIES = (
    FamilyAdapter(
        model_type="mixtral",
        config_defaults={
            "num_key_value_heads": when_absent("num_key_value_heads", 8),
            "rms_norm_eps": 1e-5,
            "rope_theta": 1_000_000.0,  # MixtralConfig's default_theta
        },
        config_overrides={
            **UNBIASED_ATTENTION,
            "moe": moe_reader(MoeKeys(num_experts="num_local_experts", normalize=True)),
        },
        weight_renames=((r"\.mlp\.", ".block_sparse_moe."),),
        experts=ExpertLayout(gate="{e}.w1.weight", up="{e}.w3.weight", down="{e}.w2.weight"),
    ),
    # Aria's text decoder (AriaTextForCausalLM): llama attention, _aria_moe in every layer; the
    # routed experts always SiLU-gated, the shared ones by hidden_act (validate_moe: silu only);
    # the shared MLP's mlp_bias would need biased shared experts, which the MoE block lacks
    FamilyAdapter(
        model_type="aria_text",
        config_defaults={"moe_num_experts": 8, "moe_topk": 2, "moe_num_shared_experts": 2},
        refused_keys=("mlp_bias",),
        config_overrides={"mlp_bias": False, "moe": _aria_moe},
        weight_renames=(
            (r"\.mlp\.gate\.", ".mlp.router."),
            (r"\.mlp\.shared_expert\.", ".mlp.shared_experts."),
        ),
        # fc1 [experts, hidden, 2 * inter] = [gate | up] columns, fc2 [experts, inter, hidden]
        experts=ExpertLayout(gate="fc1.weight", up=None, down="fc2.weight", in_out=True),
    ),
    FamilyAdapter(
        model_type="qwen3_moe",
        family_keys=READS_SLIDING_SWITCH,
        config_defaults={
            "layer_types": every_layer_windowed,
            "num_key_value_heads": when_absent("num_key_value_heads", 4),
            "moe_intermediate_size": when_absent("moe_intermediate_size", 768),
        },
        # transformers 5 writes num_local_experts; hub configs name it num_experts
        config_aliases={"num_local_experts": "num_experts"},
        config_overrides={"qk_norm": True, "moe": moe_reader(_QWEN_MOE)},
        experts=ExpertLayout(),
    ),
    FamilyAdapter(
        model_type="qwen2_moe",
        family_keys=READS_SLIDING_SWITCH,
        config_defaults={
            "layer_types": qwen2_moe_layer_types,
            "num_key_value_heads": when_absent("num_key_value_heads", 16),
            "moe_intermediate_size": when_absent("moe_intermediate_size", 1408),
            "shared_expert_intermediate_size": when_absent("shared_expert_intermediate_size", 5632),
        },
        config_overrides={
            "qkv_bias": switch("qkv_bias", True),
            "o_bias": False,
            "moe": moe_reader(
                dataclasses.replace(
                    _QWEN_MOE,
                    shared_expert="shared_expert_intermediate_size",
                    shared_expert_gate=True,
                )
            ),
        },
        experts=ExpertLayout(),
    ),
    FamilyAdapter(
        model_type="olmoe",
        # OlmoeAttention clips q/k after their norms, not at the projection as olmo does
        refused_keys=("clip_qkv",),
        config_defaults={"rms_norm_eps": 1e-5},
        config_overrides={
            "qk_norm": True,
            "qk_norm_per_head": False,
            "moe": moe_reader(MoeKeys(num_experts="num_experts")),
        },
        experts=ExpertLayout(),
    ),
    FamilyAdapter(
        model_type="granitemoe",
        config_overrides={
            **GRANITE_MULTIPLIERS,
            # a softmax over the top-k logits: the top-k softmax probabilities renormalized
            "moe": moe_reader(MoeKeys(num_experts="num_local_experts", normalize=True)),
        },
        weight_renames=_GRANITE_MOE_RENAMES,
        experts=GRANITE_EXPERTS,
    ),
    FamilyAdapter(
        model_type="phimoe",
        genai_type="phimoe",
        config_defaults={
            "num_key_value_heads": when_absent("num_key_value_heads", 8),
            "rms_norm_eps": 1e-5,
            "rope_theta": 1_000_000.0,  # PhimoeConfig's default_theta
        },
        config_overrides={
            "norm_type": "layer",
            "qkv_bias": switch("attention_bias", False),
            "o_bias": switch("attention_bias", False),
            "lm_head_bias": switch("lm_head_bias", False),
            "moe": moe_reader(
                MoeKeys(
                    num_experts="num_local_experts",
                    normalize=False,
                    sparse_mixer="router_jitter_noise",
                )
            ),
        },
        weight_renames=((r"\.mlp\.", ".block_sparse_moe."),),
        experts=ExpertLayout(gate="{e}.w1.weight", up="{e}.w3.weight", down="{e}.w2.weight"),
    ),
    # granitemoe with a shared MLP beside the experts in every layer (none with
    # shared_intermediate_size 0): input_linear [gate | up], output_linear
    FamilyAdapter(
        model_type="granitemoeshared",
        config_overrides={
            **GRANITE_MULTIPLIERS,
            "moe": moe_reader(
                MoeKeys(
                    num_experts="num_local_experts",
                    normalize=True,
                    shared_expert="shared_intermediate_size",
                )
            ),
        },
        weight_renames=GRANITE_SHARED_MLP_RENAMES,
        fused_weights=GRANITE_SHARED_MLP_FUSED,
        experts=GRANITE_EXPERTS,
    ),
    # hunyuan_v1_dense's attention (q/k norms after the rotary, NTK-alpha rope) with MoE blocks
    # in every layer: a float32 router `wg` (hunyuan_moe.py) beside a shared MLP
    FamilyAdapter(
        model_type="hunyuan_v1_moe",
        config_aliases={"moe_topk": "num_experts_per_tok"},
        config_defaults={"rms_norm_eps": 1e-5, "num_experts": 1, "num_experts_per_tok": 1},
        config_overrides={
            "qk_norm": True,
            "qk_norm_after_rope": True,
            "mlp_bias": False,
            "rope": ntk_alpha_rope,
            "moe": hunyuan_moe,
        },
        weight_renames=(
            (r"\.self_attn\.q_norm\.", ".self_attn.query_layernorm."),
            (r"\.self_attn\.k_norm\.", ".self_attn.key_layernorm."),
            (r"\.mlp\.gate\.weight$", ".mlp.gate.wg.weight"),
            (r"\.mlp\.shared_expert\.", ".mlp.shared_mlp."),
        ),
        experts=ExpertLayout(),
        float32=HUNYUAN_ROUTER,
    ),
    # olmo2's post-norm layers (RMSNorms over the whole q and k projections) with olmoe's
    # experts and routing
    FamilyAdapter(
        model_type="flex_olmo",
        config_defaults={
            "rope_theta": 500_000.0,  # FlexOlmoConfig's default_theta
            "num_experts": 7,
            "num_experts_per_tok": 5,
        },
        config_overrides={
            "norm_placement": "post",
            "qk_norm": True,
            "qk_norm_per_head": False,
            "moe": moe_reader(MoeKeys(num_experts="num_experts")),
        },
        experts=ExpertLayout(),
    ),
    DBRX,  # nested attn_config / ffn_config, flat experts, p-norm routing (dbrx.py)
    COHERE2_MOE,  # cohere2's parallel block with dense and MoE layers (cohere2_moe.py)
)
