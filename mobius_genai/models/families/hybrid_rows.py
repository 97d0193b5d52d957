"""The hybrid rows of the family table: recurrent layers (a state, no KV cache) between
attention layers (qwen3_next and granitemoehybrid add MoE blocks: config/moe.py)."""

from __future__ import annotations

import dataclasses

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.linear_attention import read_linear_attention
from mobius_genai.config.mamba2 import GRANITE_KEYS, mamba2_reader
from mobius_genai.config.moe import MoeKeys, moe_reader
from mobius_genai.config.mtp import MtpKeys
from mobius_genai.config.short_conv import read_short_conv
from mobius_genai.config.text_config import TextOnly
from mobius_genai.models.families.adapter import FamilyAdapter, FusedWeight
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY, UNBIASED_ATTENTION
from mobius_genai.models.families.float32 import CORRECTED_ROUTER, KeptFloat32
from mobius_genai.models.families.hybrid import (
    QWEN3_5_OFFSET_NORMS,
    QWEN3_NEXT_PACKED,
    granite_hybrid_layer_types,
    granite_hybrid_mlp_size,
    granite_hybrid_moe,
    granite_hybrid_no_rope,
    lfm2_intermediate_size,
    lfm2_layer_types,
    lfm2_moe,
    qwen3_5_layer_types,
    qwen3_5_norm_weights,
    qwen3_5_text_rope,
)
from mobius_genai.models.families.linear_hybrids import (
    KIMI_LINEAR_ATTENTION,
    OLMO_HYBRID_LINEAR_DEFAULTS,
    kimi_linear_attention,
    kimi_linear_layer_types,
    kimi_linear_moe,
    lara_mini_layer_types,
    lara_mini_no_rope,
    olmo_hybrid_layer_types,
    olmo_hybrid_linear_attention,
    olmo_hybrid_no_rope,
)
from mobius_genai.models.families.mamba1_rows import MAMBA1_FAMILIES
from mobius_genai.models.families.mamba2_hybrids import BAMBA, FALCON_H1, NEMOTRON_H
from mobius_genai.models.families.mamba2_rows import MAMBA2
from mobius_genai.models.families.minimax import MINIMAX
from mobius_genai.models.families.moe_rows import (
    GRANITE_EXPERTS,
    GRANITE_SHARED_MLP_FUSED,
    GRANITE_SHARED_MLP_RENAMES,
)
from mobius_genai.models.families.readers import when_absent
from mobius_genai.models.families.recurrent_gemma import RECURRENT_GEMMA
from mobius_genai.models.families.scales import GRANITE_MULTIPLIERS

# Hybrid: gated delta nets (a conv state and a recurrent state, no KV cache) between
# attention layers with an output gate, per-head q/k norms and partial rotary (1-D: the
# text decoder's mrope has one position per token); norms scale
# by 1 + weight except the delta nets' gated norm.
# The layers Qwen3.5 and Qwen3-Next share: which are delta nets, a quarter of each head
# rotated, gated attention with q/k norms, the delta nets' settings.
_QWEN3_5_LAYER_DEFAULTS = {
    "layer_types": qwen3_5_layer_types,
    "partial_rotary_factor": 0.25,
    "head_dim": when_absent("head_dim", 256),
}
# Qwen3NextConfig's and Qwen3_5MoeTextConfig's key/value heads and shared expert.
_QWEN3_NEXT_MOE_DEFAULTS = {
    "num_key_value_heads": when_absent("num_key_value_heads", 2),
    "shared_expert_intermediate_size": when_absent("shared_expert_intermediate_size", 512),
}
_QWEN3_5_LAYERS = {
    "qk_norm": True,
    "attention_output_gate": True,
    "linear_attention": read_linear_attention,
}

QWEN3_5_TEXT = FamilyAdapter(
    model_type="qwen3_5_text",
    family_keys=READS_PARTIAL_ROTARY,
    genai_type="qwen3_5_text",
    config_defaults={
        **_QWEN3_5_LAYER_DEFAULTS,
        "num_key_value_heads": when_absent("num_key_value_heads", 4),
    },
    config_overrides={**_QWEN3_5_LAYERS, "rope": qwen3_5_text_rope},
    preprocess_weight=qwen3_5_norm_weights,
    preprocessed_weights=QWEN3_5_OFFSET_NORMS,
    # the multi-token-prediction head: mtp.onnx when config.json declares it, else unread
    unused_weights=(r"^mtp\.",),
    mtp=MtpKeys(),
)

# Qwen3.5's hybrid with MoE blocks in every layer: qwen3_5_text's layers and rotary, routing
# as qwen3_next's (a shared expert with its sigmoid gate) with the top-k always renormalized
# (Qwen3_5MoeTopKRouter); transformers saves the experts per expert (qwen2_moe's layout).
QWEN3_5_MOE_TEXT = dataclasses.replace(
    QWEN3_5_TEXT,
    model_type="qwen3_5_moe_text",
    genai_type="qwen3_5_moe_text",
    # no dense MLP and no intermediate_size: the experts' size stands in for it
    config_aliases={"moe_intermediate_size": "intermediate_size"},
    config_defaults={**_QWEN3_5_LAYER_DEFAULTS, **_QWEN3_NEXT_MOE_DEFAULTS},
    config_overrides={
        **QWEN3_5_TEXT.config_overrides,
        "moe": moe_reader(
            MoeKeys(
                num_experts="num_experts",
                intermediate="moe_intermediate_size",
                normalize=True,
                shared_expert="shared_expert_intermediate_size",
                shared_expert_gate=True,
            )
        ),
    },
    experts=ExpertLayout(),
)

# Qwen3_5TextConfig's defaults, for keys a hub config's `text_config` omits.
QWEN3_5_TEXT_DEFAULTS = {
    "vocab_size": 248_320,
    "hidden_size": 4096,
    "intermediate_size": 12_288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}

# Qwen3_5MoeTextConfig's defaults, for keys a hub config's `text_config` omits.
QWEN3_5_MOE_TEXT_DEFAULTS = {
    **{key: value for key, value in QWEN3_5_TEXT_DEFAULTS.items() if key != "intermediate_size"},
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 8,
    "num_experts": 256,
}


def _text_only_hub_row(text: FamilyAdapter, model_type: str, defaults: dict) -> FamilyAdapter:
    """`text`'s row for the multimodal hub layout `model_type` built text-only: the decoder of
    `text_config` from the `model.language_model.` weights; the vision tower and the
    multi-token-prediction head (_keys_to_ignore_on_load_unexpected) are not built; the LM
    head tied by the top-level `tie_word_embeddings` (the config class's default: false)."""
    return dataclasses.replace(
        text,
        model_type=model_type,
        weight_renames=((r"^model\.", "model.language_model."),),
        unused_weights=(r"^model\.visual\.", r"^mtp\."),
        text_only=TextOnly(
            not_built="the vision tower (model.visual.*): a text-only bundle",
            text_defaults=defaults,
            top_level_keys={"tie_word_embeddings": False},
        ),
    )


# Hybrid: short-convolution layers (a recurrent state, no KV cache) between attention layers
# with per-head q/k RMSNorms; the final norm is called embedding_norm.
LFM2 = FamilyAdapter(
    model_type="lfm2",
    genai_type="lfm2",
    config_aliases={
        "tie_embedding": "tie_word_embeddings",
        "block_ff_dim": "intermediate_size",
    },
    config_defaults={
        "tie_word_embeddings": True,
        "layer_types": lfm2_layer_types,
        "num_key_value_heads": when_absent("num_key_value_heads", 8),
        "norm_eps": 1e-5,
        "rope_theta": 1_000_000.0,  # Lfm2Config's default_theta
        "block_ffn_dim_multiplier": when_absent("block_ffn_dim_multiplier", 1.0),
    },
    config_overrides={
        **UNBIASED_ATTENTION,
        "qk_norm": True,
        "intermediate_size": lfm2_intermediate_size,
        "short_conv": read_short_conv,
    },
    weight_renames=(
        (r"\.input_layernorm\.", ".operator_norm."),
        (r"\.post_attention_layernorm\.", ".ffn_norm."),
        (r"\.self_attn\.o_proj\.", ".self_attn.out_proj."),
        (r"\.self_attn\.(q|k)_norm\.", r".self_attn.\1_layernorm."),
        (r"\.mlp\.gate_proj\.", ".feed_forward.w1."),
        (r"\.mlp\.up_proj\.", ".feed_forward.w3."),
        (r"\.mlp\.down_proj\.", ".feed_forward.w2."),
        (r"^model\.norm\.", "model.embedding_norm."),
    ),
)

# LFM2's hybrid with MoE blocks after the first num_dense_layers (Lfm2MoeForCausalLM): its
# dense MLPs as wide as intermediate_size (no block_auto_adjust_ff_dim), routing as
# hybrid.lfm2_moe reads it; the hub and transformers store the experts per expert (w1, w3, w2)
# and the routing correction as feed_forward.expert_bias.
LFM2_MOE = dataclasses.replace(
    LFM2,
    model_type="lfm2_moe",
    genai_type="lfm2_moe",
    config_defaults={
        **LFM2.config_defaults,
        "moe_intermediate_size": when_absent("moe_intermediate_size", 1792),
    },
    config_overrides={
        **LFM2.config_overrides,
        "intermediate_size": lambda raw: fields.require(raw, "intermediate_size"),
        "moe": lfm2_moe,
    },
    weight_renames=(
        (r"\.mlp\.gate\.e_score_correction_bias$", ".feed_forward.expert_bias"),
        *LFM2.weight_renames,
        (r"\.mlp\.(gate\.|experts$)", r".feed_forward.\1"),
    ),
    experts=ExpertLayout(gate="{e}.w1.weight", up="{e}.w3.weight", down="{e}.w2.weight"),
    # Lfm2MoeSparseMoeBlock's expert_bias buffer is float32 whatever the model's dtype
    float32=KeptFloat32(declared=("expert_bias",)),
)

# OLMo hybrid: gated delta nets (q, k, v projected and convolved apart; beta doubled; the
# gated norm at 1e-5) in pre-norm layers between olmo3's post-norm attention layers (q/k norms over the whole
# projection); NoPE where rope_parameters has no rope_theta (the released checkpoints).
# onnxruntime-genai 0.18 runs it as its generic decoder, which finds the states by their names.
OLMO_HYBRID = FamilyAdapter(
    model_type="olmo_hybrid",
    config_defaults={"layer_types": olmo_hybrid_layer_types, **OLMO_HYBRID_LINEAR_DEFAULTS},
    config_overrides={
        "norm_placement": "post",
        "recurrent_norm_placement": "pre",
        "qk_norm": True,
        "qk_norm_per_head": False,
        "no_rope_layers": olmo_hybrid_no_rope,
        "linear_attention": olmo_hybrid_linear_attention,
    },
    weight_renames=(
        (r"\.linear_attn\.in_proj_a\.", ".linear_attn.a_proj."),
        (r"\.linear_attn\.in_proj_b\.", ".linear_attn.b_proj."),
        (r"\.linear_attn\.in_proj_z\.", ".linear_attn.g_proj."),
        (r"\.linear_attn\.out_proj\.", ".linear_attn.o_proj."),
        (r"\.linear_attn\.norm\.", ".linear_attn.o_norm."),
        # transformers' conversion mapping: the hub's names of the layers' first two norms
        (r"\.input_layernorm\.", ".attention_layer_norm."),
        (r"\.post_attention_layernorm\.", ".feedforward_layer_norm."),
    ),
)

# Lara-Mini: Qwen3.5's gated delta nets (stored as one in_proj, rows [q | k | v | z | b | a], and
# a gated norm named out_norm) between qwen3 attention layers that rotate and slide
# ("sliding_attention") or attend globally without rotary ("full_attention"); every norm scales by
# its weight; MoE blocks in every layer (softmax top-k, renormalized by default, a shared expert
# added without a gate). onnxruntime-genai 0.18 runs it as its generic decoder.
LARA_MINI = FamilyAdapter(
    model_type="lara_mini",
    # no dense MLP and no intermediate_size: the experts' size stands in for it
    config_aliases={"moe_intermediate_size": "intermediate_size"},
    config_defaults={
        "layer_types": lara_mini_layer_types,
        "tie_word_embeddings": True,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "sliding_window": 512,
        "linear_num_key_heads": 8,
        "linear_num_value_heads": 16,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
    },
    config_overrides={
        "qk_norm": True,
        "no_rope_layers": lara_mini_no_rope,
        "linear_attention": read_linear_attention,
        "moe": moe_reader(
            MoeKeys(
                num_experts="num_experts",
                intermediate="moe_intermediate_size",
                normalize_default=True,
                shared_expert="shared_expert_intermediate_size",
            )
        ),
    },
    weight_renames=((r"\.linear_attn\.norm\.", ".linear_attn.out_norm."),),
    fused_weights=(
        FusedWeight(
            pattern=r"\.linear_attn\.in_proj_(?P<part>qkv|z|b|a)\.weight$",
            fused=r".linear_attn.in_proj.weight",
            parts=("qkv", "z", "b", "a"),
        ),
    ),
    # stacked: gate_up_proj [E, 2I, H] ([gate | up] rows), down_proj [E, H, I]
    experts=ExpertLayout(gate="gate_up_proj", up=None, down="down_proj"),
)

# Kimi Linear: Kimi delta attention (the gated delta rule with a decay per key channel, q, k
# and v convolved apart, low-rank forget and output gates, a sigmoid-gated norm) between
# DeepSeek's latent attention without rotary; DeepSeek-V3's MoE blocks (sigmoid routing with a
# correction bias, groups, shared experts) where mlp_layer_types says "sparse". The hub names
# both token mixers self_attn and every MLP block_sparse_moe, and spells the MoE keys as
# KimiLinearConfig's attribute_map (num_experts, moe_renormalize, ...). onnxruntime-genai 0.18
# runs it as its generic decoder (the latent cache as one key/value head, the states by name).
KIMI_LINEAR = FamilyAdapter(
    model_type="kimi_linear",
    config_aliases={
        "model_max_length": "max_position_embeddings",
        "num_experts": "n_routed_experts",
        "num_local_experts": "n_routed_experts",
        "num_experts_per_token": "num_experts_per_tok",
        "num_expert_group": "n_group",
        "moe_renormalize": "norm_topk_prob",
        "num_shared_experts": "n_shared_experts",
    },
    config_defaults={
        "layer_types": kimi_linear_layer_types,
        "rms_norm_eps": 1e-5,
        "num_key_value_heads": when_absent("num_key_value_heads", 32),
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "moe_intermediate_size": 1024,
        "num_experts_per_tok": 8,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.446,
        "norm_topk_prob": True,
    },
    config_overrides={
        **KIMI_LINEAR_ATTENTION,
        "linear_attention": kimi_linear_attention,
        "moe": kimi_linear_moe,
    },
    weight_renames=(
        (r"\.linear_attn\.norm\.", ".linear_attn.o_norm."),
        (r"\.linear_attn\.out_proj\.", ".linear_attn.o_proj."),
        (r"\.linear_attn\.", ".self_attn."),
        (r"\.mlp\.shared_expert\.", ".mlp.shared_experts."),
        (r"\.mlp\.", ".block_sparse_moe."),
    ),
    experts=ExpertLayout(gate="{e}.w1.weight", up="{e}.w3.weight", down="{e}.w2.weight"),
    float32=CORRECTED_ROUTER,
)

HYBRID_FAMILIES = (
    LFM2,
    LFM2_MOE,
    QWEN3_5_TEXT,
    QWEN3_5_MOE_TEXT,
    # Qwen3.5-MoE's hub checkpoints (Qwen3_5MoeForConditionalGeneration) built text-only as
    # qwen3_5's are.
    _text_only_hub_row(QWEN3_5_MOE_TEXT, "qwen3_5_moe", QWEN3_5_MOE_TEXT_DEFAULTS),
    # Qwen3.5's hub checkpoints (Qwen3_5ForConditionalGeneration) built text-only, as
    # onnxruntime-genai's builder does.
    _text_only_hub_row(QWEN3_5_TEXT, "qwen3_5", QWEN3_5_TEXT_DEFAULTS),
    # Qwen3.5's hybrid a generation earlier, with MoE blocks: the delta nets' projections
    # packed per key head (in_proj_qkvz, in_proj_ba: read back as qwen3_5_text's), routing as
    # qwen2_moe's (a shared expert with its sigmoid gate; the top-k renormalized by default;
    # mlp_only_layers / decoder_sparse_step keep dense MLPs). onnxruntime-genai 0.18 has no
    # qwen3_next type; qwen3_5_moe_text is its type for the same hybrid with MoE blocks.
    FamilyAdapter(
        model_type="qwen3_next",
        family_keys=READS_PARTIAL_ROTARY,
        genai_type="qwen3_5_moe_text",
        config_defaults={
            **_QWEN3_5_LAYER_DEFAULTS,
            **_QWEN3_NEXT_MOE_DEFAULTS,
            "moe_intermediate_size": when_absent("moe_intermediate_size", 512),
        },
        config_overrides={
            **_QWEN3_5_LAYERS,
            "moe": moe_reader(
                MoeKeys(
                    num_experts="num_experts",
                    intermediate="moe_intermediate_size",
                    normalize_default=True,
                    sparse_step="decoder_sparse_step",
                    dense_layers="mlp_only_layers",
                    shared_expert="shared_expert_intermediate_size",
                    shared_expert_gate=True,
                )
            ),
        },
        preprocess_weight=qwen3_5_norm_weights,
        preprocessed_weights=QWEN3_5_OFFSET_NORMS,
        experts=ExpertLayout(),
        grouped_weights=QWEN3_NEXT_PACKED,
        # the multi-token-prediction head (Qwen3NextPreTrainedModel's
        # _keys_to_ignore_on_load_unexpected): mtp.onnx when config.json declares it, else unread
        unused_weights=(r"^mtp\.",),
        mtp=MtpKeys(),
    ),
    # Granite-4.0-H: Mamba2 layers (a conv state and a scan state, no KV cache) between
    # attention layers without rotary (position_embedding_type "nope"); granite's multipliers;
    # every layer's MLP is the shared MLP (input_linear: gate | up), plus MoE experts routed as
    # granitemoe's unless num_local_experts is 0 (the dense layouts; Granite-4.0-Micro also
    # has no Mamba2 layer). onnxruntime-genai 0.18 runs it as its generic decoder, which finds
    # the states by their names.
    FamilyAdapter(
        model_type="granitemoehybrid",
        config_aliases={"layers_block_type": "layer_types"},
        config_defaults={"num_local_experts": 8, "shared_intermediate_size": 1024},
        config_overrides={
            **GRANITE_MULTIPLIERS,
            "layer_types": granite_hybrid_layer_types,
            "no_rope_layers": granite_hybrid_no_rope,
            "intermediate_size": granite_hybrid_mlp_size,
            "moe": granite_hybrid_moe,
            "mamba2": mamba2_reader(GRANITE_KEYS),
        },
        weight_renames=GRANITE_SHARED_MLP_RENAMES,
        fused_weights=GRANITE_SHARED_MLP_FUSED,
        experts=GRANITE_EXPERTS,
    ),
    # Nemotron-H (one block per layer: Mamba2, attention without rotary, or a relu2 MLP) and
    # Falcon-H1 (attention and Mamba2 side by side in every layer, µP multipliers):
    # mamba2_hybrids.py. onnxruntime-genai 0.18 runs both as its generic decoder.
    NEMOTRON_H,
    FALCON_H1,
    # Bamba: Mamba2 layers and rotary attention layers, a gated MLP after each (mamba2_hybrids.py)
    BAMBA,
    # Mamba and FalconMamba (Mamba1 mixers alone), Jamba (Mamba1 mixers, attention and MoE):
    # mamba1_rows.py. onnxruntime-genai 0.18 runs them as its generic decoder.
    *MAMBA1_FAMILIES,
    # Mamba2 (Codestral Mamba): Mamba2 mixers alone, laid out as Mamba's (mamba2_rows.py)
    MAMBA2,
    # RecurrentGemma: RG-LRU blocks and local attention in block_types' pattern
    # (recurrent_gemma.py). onnxruntime-genai 0.18 runs it as its generic decoder.
    RECURRENT_GEMMA,
    # MiniMax: lightning attention between GQA layers, MoE MLPs, scaled residuals
    # (minimax.py). onnxruntime-genai 0.18 runs it as its generic decoder.
    MINIMAX,
    OLMO_HYBRID,
    LARA_MINI,
    KIMI_LINEAR,
)
