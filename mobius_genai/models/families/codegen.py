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
from mobius_genai.models.families.gpt2_names import (
    GPT2_CONFIG_NAMES,
    GPTJ_BLOCK,
    GPTJ_DEFAULTS,
    GPTJ_LAYOUT,
)
from mobius_genai.models.families.preprocess import (
    CODEGEN_SHARDS,
    PACKED_QKV,
    qkv_blocks_from_codegen_shards,
)


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
        **GPTJ_DEFAULTS,
        "max_position_embeddings": 2048,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    },
    config_overrides={**GPTJ_BLOCK, "num_key_value_heads": _codegen_heads, "packed_qkv": True},
    weight_renames=GPTJ_LAYOUT,
    # CodeGenPreTrainedModel's _keys_to_ignore_on_load_unexpected
    unused_weights=(r"\.attn\.causal_mask$",),
    preprocess_weight=qkv_blocks_from_codegen_shards,
    preprocessed_weights=PACKED_QKV,
)
