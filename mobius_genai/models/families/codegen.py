"""codegen (Salesforce CodeGen 350M-16B, mono, multi and nl): GPT-J's layer (one shared norm
feeding attention and MLP beside each other, rotary on the first `rotary_dim` channels of each
head by adjacent pairs, a biased lm_head) with q, k and v fused in one qkv_proj stored in
CodeGen's four model-parallel shards, each [q, v, k] (preprocess.qkv_blocks_from_codegen_shards).

Defaults are CodeGenConfig's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY
from mobius_genai.models.families.gpt2_names import GPT2_CONFIG_NAMES, GPT2_LAYOUT
from mobius_genai.models.families.heads import split_hidden
from mobius_genai.models.families.preprocess import (
    CODEGEN_SHARDS,
    PACKED_QKV,
    qkv_blocks_from_codegen_shards,
)
from mobius_genai.models.families.rope import gptj_partial_rotary, gptj_rope


def _codegen_heads(raw: Mapping[str, Any]) -> int:
    """One key/value head per query head; the hidden size must split into the four shards."""
    hidden = fields.require(raw, "hidden_size")
    if hidden % CODEGEN_SHARDS:
        raise ConfigError(
            f"config.json: field 'n_embd' must be a multiple of {CODEGEN_SHARDS}, the shards "
            f"CodeGen's qkv_proj is stored in, found {hidden}"
        )
    return fields.require(raw, "num_attention_heads")


CODEGEN = FamilyAdapter(
    model_type="codegen",
    family_keys=READS_PARTIAL_ROTARY,
    config_aliases=GPT2_CONFIG_NAMES,
    config_defaults={
        "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
        "hidden_act": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 2048,
        "partial_rotary_factor": gptj_partial_rotary,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    },
    config_overrides={
        "head_dim": split_hidden,
        "num_key_value_heads": _codegen_heads,
        "norm_type": "layer",
        "parallel_residual": True,  # one shared norm (ln_1) feeds attention and MLP
        "gated_mlp": False,
        "qkv_bias": False,
        "o_bias": False,
        "mlp_bias": True,
        "lm_head_bias": True,
        "packed_qkv": True,
        "rope_interleaved": True,  # rotate_every_two
        "rope": gptj_rope,
    },
    weight_renames=(
        (r"\.self_attn\.o_proj\.", ".attn.out_proj."),
        (r"\.self_attn\.", ".attn."),
        (r"\.mlp\.fc1\.", ".mlp.fc_in."),
        (r"\.mlp\.fc2\.", ".mlp.fc_out."),
        *GPT2_LAYOUT,
    ),
    # CodeGenPreTrainedModel's _keys_to_ignore_on_load_unexpected
    unused_weights=(r"\.attn\.causal_mask$",),
    preprocess_weight=qkv_blocks_from_codegen_shards,
    preprocessed_weights=PACKED_QKV,
)
