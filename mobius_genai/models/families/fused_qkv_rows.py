"""Decoders whose checkpoints fuse q, k and v into one tensor stored by key/value group:
gpt_bigcode (StarCoder 1, SantaCoder: GPT-2's layer with multi-query attention) and falcon
(Falcon-7B's multi-query, Falcon-40B/180B's and Falcon2-11B's grouped-query "new decoder
architecture", parallel attention and MLP; Falcon-RW's ALiBi positions instead of the rotary
embedding where config.json's `alibi` says).

Both build as the packed projection ([q | k | v], `packed_qkv`), its rows regrouped as they
are read (preprocess.qkv_blocks_from_head_rows); the key/value head count is the one each
transformers class derives from its switches. Defaults are the config classes'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.alibi import Alibi
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.gpt2_names import (
    GPT2_BLOCK,
    GPT2_CONFIG_NAMES,
    GPT2_DEFAULTS,
    GPT2_LAYOUT,
)
from mobius_genai.models.families.heads import split_hidden
from mobius_genai.models.families.preprocess import PACKED_QKV, qkv_blocks_from_head_rows
from mobius_genai.models.families.readers import switch


def _bigcode_kv_heads(raw: Mapping[str, Any]) -> int:
    """GPTBigCodeConfig: one key/value head with multi_query (its default), else one per head."""
    if fields.flag(raw.get("multi_query"), "multi_query", True):
        return 1
    return fields.require(raw, "num_attention_heads")


def _falcon_kv_heads(raw: Mapping[str, Any]) -> int:
    """FalconConfig: num_kv_heads groups in the new decoder architecture, one head with
    multi_query, else one per query head (query_key_value holds [q, k, v] per head)."""
    heads = fields.require(raw, "num_attention_heads")
    kv_heads = fields.integer(raw.get("num_kv_heads"), "num_kv_heads", heads)
    if _new_architecture(raw):
        return kv_heads
    if fields.flag(raw.get("multi_query"), "multi_query", True):
        return 1
    if kv_heads != heads:
        raise UnsupportedModelError(
            f"config.json: num_kv_heads is {kv_heads} with multi_query and "
            f"new_decoder_architecture off; falcon models are supported with one key/value head "
            f"per query head there ({heads}), as their query_key_value holds"
        )
    return heads


def _new_architecture(raw: Mapping[str, Any]) -> bool:
    return fields.flag(raw.get("new_decoder_architecture"), "new_decoder_architecture", False)


def _falcon_parallel(raw: Mapping[str, Any]) -> bool:
    """Attention and MLP beside each other (parallel_attn; always in the new architecture,
    whose FalconDecoderLayer cannot run without it)."""
    parallel = fields.flag(raw.get("parallel_attn"), "parallel_attn", True)
    if _new_architecture(raw) and not parallel:
        raise UnsupportedModelError(
            "config.json: parallel_attn is false with new_decoder_architecture; falcon models "
            "are supported with parallel_attn true there, the only layout FalconDecoderLayer runs"
        )
    return parallel


def _falcon_two_norms(raw: Mapping[str, Any]) -> bool:
    """The new architecture's parallel layer normalizes attention and MLP inputs apart (ln_attn,
    ln_mlp) unless num_ln_in_parallel_attn is 1 (Falcon2-11B)."""
    count = fields.integer(raw.get("num_ln_in_parallel_attn"), "num_ln_in_parallel_attn", 2)
    return _new_architecture(raw) and count == 2


#: The tensor names Falcon keeps from BLOOM (falcon; bloom adds its embeddings' LayerNorm).
BLOOM_NAMES = (
    (r"\.self_attn\.qkv_proj\.", ".self_attention.query_key_value."),
    (r"\.self_attn\.o_proj\.", ".self_attention.dense."),
    (r"\.mlp\.fc1\.", ".mlp.dense_h_to_4h."),
    (r"\.mlp\.fc2\.", ".mlp.dense_4h_to_h."),
    (r"^model\.layers\.", "transformer.h."),
    (r"^model\.embed_tokens\.", "transformer.word_embeddings."),
    (r"^model\.norm\.", "transformer.ln_f."),
)


def _falcon_alibi(raw: Mapping[str, Any]) -> bool:
    return fields.flag(raw.get("alibi"), "alibi", False)


#: Falcon-RW's positions: FalconModel rounds slopes and products to bfloat16 and divides the
#: bias by sqrt(head_dim) with the scores (config/alibi.py).
_FALCON_ALIBI = Alibi(bfloat16=True, scaled=True)

GPT_BIGCODE = FamilyAdapter(
    model_type="gpt_bigcode",
    config_aliases=GPT2_CONFIG_NAMES,
    config_defaults={**GPT2_DEFAULTS, "hidden_act": "gelu_pytorch_tanh"},
    config_overrides={**GPT2_BLOCK, "num_key_value_heads": _bigcode_kv_heads, "packed_qkv": True},
    refused_keys=("add_cross_attention",),
    weight_renames=(
        (r"\.self_attn\.qkv_proj\.", ".attn.c_attn."),
        (r"\.self_attn\.o_proj\.", ".attn.c_proj."),
        (r"\.mlp\.fc1\.", ".mlp.c_fc."),
        (r"\.mlp\.fc2\.", ".mlp.c_proj."),
        (r"\.post_attention_layernorm\.", ".ln_2."),
        (r"^model\.embed_positions\.", "transformer.wpe."),
        *GPT2_LAYOUT,
    ),
    optional_prefix="transformer.",
    preprocess_weight=qkv_blocks_from_head_rows,
    preprocessed_weights=PACKED_QKV,
)

FALCON = FamilyAdapter(
    model_type="falcon",
    config_aliases={
        "n_embed": "hidden_size",
        "ffn_hidden_size": "intermediate_size",
        "activation": "hidden_act",
    },
    config_defaults={
        "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
        "hidden_act": "gelu",
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    config_overrides={
        "head_dim": split_hidden,  # FalconConfig.head_dim is a property of the two sizes
        "num_key_value_heads": _falcon_kv_heads,
        "norm_type": "layer",
        "gated_mlp": False,
        "qkv_bias": switch("bias", False),
        "o_bias": switch("bias", False),
        "mlp_bias": switch("bias", False),
        "packed_qkv": True,
        "parallel_residual": _falcon_parallel,
        "parallel_mlp_norm": _falcon_two_norms,
        "position_embedding": lambda raw: "alibi" if _falcon_alibi(raw) else "rope",
        "alibi": lambda raw: _FALCON_ALIBI if _falcon_alibi(raw) else None,
    },
    weight_renames=BLOOM_NAMES,
    # the new architecture's two parallel norms: ln_attn and ln_mlp
    fallback_renames=(
        (r"\.input_layernorm\.", ".ln_attn."),
        (r"\.post_attention_layernorm\.", ".ln_mlp."),
    ),
    optional_prefix="transformer.",
    preprocess_weight=qkv_blocks_from_head_rows,
    preprocessed_weights=PACKED_QKV,
)

FUSED_QKV_FAMILIES = (GPT_BIGCODE, FALCON)
