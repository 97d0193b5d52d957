"""Decoders positioned by ALiBi (config/alibi.py, components/alibi.py) instead of a rotary
embedding: bloom (BLOOM, BLOOMZ) and mpt (MPT-7B/30B).

bloom: LayerNorms with biases (one on the token embeddings, word_embeddings_layernorm), one
biased query_key_value holding [q, k, v] per head (regrouped as read, as gpt_neox's), a GELU
(tanh) FC MLP, a tied head, each block's residual its normed input where
apply_residual_connection_post_layernorm says. mpt: LayerNorms without bias, one unbiased Wqkv holding the
[q | k | v] blocks, an exact-GELU FC MLP of 4 x d_model, a tied head, its attention settings in
config.json's nested `attn_config` (clip_qkv, softmax_scale), whose switches transformers'
MptModel does not run are refused in one line. Defaults are the config classes'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.alibi import Alibi
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.fused_qkv_rows import BLOOM_NAMES
from mobius_genai.models.families.heads import kv_head_per_head, split_hidden
from mobius_genai.models.families.preprocess import PACKED_QKV, qkv_blocks_from_head_rows
from mobius_genai.models.families.readers import switch

#: Both rows' layer: no rotary, one packed q/k/v projection, an FC MLP, one head per kv head.
_ALIBI_BLOCK = {
    "position_embedding": "alibi",
    "alibi": Alibi(),
    "head_dim": split_hidden,
    "num_key_value_heads": kv_head_per_head,
    "packed_qkv": True,
    "gated_mlp": False,
}

BLOOM = FamilyAdapter(
    model_type="bloom",
    config_aliases={
        "n_embed": "hidden_size",
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "seq_length": "max_position_embeddings",
    },
    config_defaults={
        "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 2048,  # ALiBi has no position table: og's context length
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    config_overrides={
        **_ALIBI_BLOCK,
        "hidden_act": "gelu_pytorch_tanh",  # bloom_gelu_forward
        "norm_type": "layer",
        "embedding_layernorm": True,
        "residual_after_norm": switch("apply_residual_connection_post_layernorm", False),
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
    },
    weight_renames=(
        *BLOOM_NAMES,
        (r"^model\.embed_norm\.", "transformer.word_embeddings_layernorm."),
    ),
    optional_prefix="transformer.",
    preprocess_weight=qkv_blocks_from_head_rows,
    preprocessed_weights=PACKED_QKV,
)

#: attn_config switches transformers' MptAttention does not run, with the value it runs.
_MPT_RUNS = {
    "attn_type": "multihead_attention",
    "prefix_lm": False,
    "qk_ln": False,
    "attn_uses_sequence_id": False,
    "alibi": True,
    "alibi_bias_max": 8,  # MptModel builds its bias with 8 whatever the config says
}


def _attn_config(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """config.json's attn_config, each switch transformers' MptModel ignores at the value it
    runs (absent or null keys take MptAttentionConfig's defaults)."""
    section = raw.get("attn_config") or {}
    if not isinstance(section, Mapping):
        raise UnsupportedModelError(
            f"config.json: attn_config must be an object, found {section!r}"
        )
    for key, runs in _MPT_RUNS.items():
        value = section.get(key)
        if value is not None and value != runs:
            raise UnsupportedModelError(
                f"config.json: attn_config.{key} is {value!r}; mpt models are supported only "
                f"with {runs!r}, the attention transformers' MptModel runs"
            )
    return section


def _mpt_scale(raw: Mapping[str, Any]) -> float | None:
    section = _attn_config(raw)
    return fields.number(section.get("softmax_scale"), "attn_config.softmax_scale", positive=True)


def _mpt_clip(raw: Mapping[str, Any]) -> float | None:
    clip = _attn_config(raw).get("clip_qkv")
    return clip or None  # MptAttention clips only with a truthy clip_qkv


def _mpt_unbiased(raw: Mapping[str, Any]) -> bool:
    """False; no_bias false is refused: transformers' MptModel builds no bias whatever it says."""
    if not fields.flag(raw.get("no_bias"), "no_bias", True):
        raise UnsupportedModelError(
            "config.json: no_bias is false; mpt models are supported only with no_bias true, "
            "the layers transformers' MptModel builds"
        )
    return False


MPT = FamilyAdapter(
    model_type="mpt",
    config_aliases={
        "d_model": "hidden_size",
        "n_layers": "num_hidden_layers",
        "n_heads": "num_attention_heads",
        "max_seq_len": "max_position_embeddings",
    },
    config_defaults={
        # MptMLP: 4 x d_model, whatever expansion_ratio says
        "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    config_overrides={
        **_ALIBI_BLOCK,
        "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
        "mlp_bias": _mpt_unbiased,
        "hidden_act": "gelu",
        "norm_type": "layer_no_bias",
        "attention_scale": _mpt_scale,
        "clip_qkv": _mpt_clip,
    },
    # logits multiplied by logit_scale (MosaicML's code; transformers' MptForCausalLM ignores it)
    refused_keys=("logit_scale",),
    weight_renames=(
        (r"\.self_attn\.qkv_proj\.", ".attn.Wqkv."),
        (r"\.self_attn\.o_proj\.", ".attn.out_proj."),
        (r"\.mlp\.fc1\.", ".ffn.up_proj."),
        (r"\.mlp\.fc2\.", ".ffn.down_proj."),
        (r"\.input_layernorm\.", ".norm_1."),
        (r"\.post_attention_layernorm\.", ".norm_2."),
        (r"^model\.layers\.", "transformer.blocks."),
        (r"^model\.embed_tokens\.", "transformer.wte."),
        (r"^model\.norm\.", "transformer.norm_f."),
    ),
    optional_prefix="transformer.",
)

ALIBI_FAMILIES = (BLOOM, MPT)
