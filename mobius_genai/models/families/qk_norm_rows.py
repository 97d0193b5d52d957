"""Decoders that normalize queries and keys per head and run a relu² FC MLP: persimmon
(Adept's Persimmon-8B: LayerNorms with biases everywhere, gpt_neox's fused query_key_value
stored [q, k, v] per head, rotary on the first half of each head) and nanochat (Karpathy's
nanochat: qwen3's attention with weightless RMSNorms everywhere, q and k normalized after the
rotation, which turns the other way, the embeddings normalized too, logits softcapped).

Defaults are what each transformers config class fills in when config.json lacks the key.
"""

from __future__ import annotations

from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY
from mobius_genai.models.families.heads import hidden_over_heads, kv_head_per_head
from mobius_genai.models.families.preprocess import (
    PACKED_QKV,
    QK_PROJECTIONS,
    negated_second_rotary_halves,
    qkv_blocks_from_head_rows,
)
from mobius_genai.models.families.readers import switch
from mobius_genai.models.families.scales import softcap

PERSIMMON = FamilyAdapter(
    model_type="persimmon",
    family_keys=READS_PARTIAL_ROTARY,
    config_defaults={
        "partial_rotary_factor": 0.5,
        "hidden_act": "relu2",
        "layer_norm_eps": 1e-5,
        "intermediate_size": 16384,
        "max_position_embeddings": 16384,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    config_overrides={
        "head_dim": hidden_over_heads,
        "num_key_value_heads": kv_head_per_head,
        "norm_type": "layer",
        "gated_mlp": False,
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "packed_qkv": True,
        # one LayerNorm over head_dim, its weight and bias shared by every head
        "qk_norm": switch("qk_layernorm", True),
    },
    weight_renames=(
        (r"\.self_attn\.qkv_proj\.", ".self_attn.query_key_value."),
        (r"\.self_attn\.o_proj\.", ".self_attn.dense."),
        (r"\.self_attn\.(q|k)_norm\.", r".self_attn.\1_layernorm."),
        (r"\.mlp\.fc1\.", ".mlp.dense_h_to_4h."),
        (r"\.mlp\.fc2\.", ".mlp.dense_4h_to_h."),
        (r"^model\.norm\.", "model.final_layernorm."),
    ),
    preprocess_weight=qkv_blocks_from_head_rows,
    preprocessed_weights=PACKED_QKV,
)

NANOCHAT = FamilyAdapter(
    model_type="nanochat",
    config_defaults={
        "hidden_act": "relu2",
        "rms_norm_eps": 1e-6,
        "intermediate_size": 8192,
        "max_position_embeddings": 2048,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 1,
    },
    config_overrides={
        "norm_type": "rms_no_affine",
        "embedding_norm": True,
        "gated_mlp": False,
        "o_bias": switch("attention_bias", False),  # Qwen3Attention's o_proj reads it too
        "mlp_bias": False,
        # normalized after the rotation there; a weightless RMSNorm over the head commutes
        # with a rotation, so before it (where the cpu graph's attention rotates) is the same
        "qk_norm": True,
        "final_logit_softcapping": softcap("final_logit_softcapping", 15.0),
    },
    preprocess_weight=negated_second_rotary_halves,
    preprocessed_weights=QK_PROJECTIONS,
)

QK_NORM_FAMILIES = (PERSIMMON, NANOCHAT)
