"""Weight preprocessors: value changes a family makes to checkpoint tensors as they are read.

Each is a FamilyAdapter.preprocess_weight hook with the regex of the graph parameters it
changes (FamilyAdapter.preprocessed_weights), so every other tensor streams as stored.
"""

from __future__ import annotations

import re

import numpy as np

from mobius_genai.config import ArchitectureConfig

NORM_WEIGHTS = r"norm\.weight$"


def offset_norm_weights(name: str, array: np.ndarray, config: ArchitectureConfig) -> np.ndarray:
    """Gemma's RMSNorm and nemotron's LayerNorm1P scale by 1 + weight: store 1 + weight as
    the norm op's scale."""
    if re.search(NORM_WEIGHTS, name):
        return array.astype(np.float32) + 1.0
    return array


PACKED_QKV = r"\.qkv_proj\.(weight|bias)$"


def qkv_blocks_from_head_rows(
    name: str, array: np.ndarray, config: ArchitectureConfig
) -> np.ndarray:
    """A fused query_key_value stored by key/value group, [q.. k v] for each group
    (gpt_neox's [q_0, k_0, v_0, q_1, ...], one query head per group; Falcon's
    num_kv_heads groups; one group for multi-query attention), head_dim rows per head, regrouped
    into the [q | k | v] blocks of the packed projection."""
    if not re.search(PACKED_QKV, name):
        return array
    groups, head_dim = config.num_key_value_heads, config.head_dim
    per_group = config.num_attention_heads // groups
    rest = array.shape[1:]
    by_group = array.reshape(groups, per_group + 2, head_dim, *rest)
    q = by_group[:, :per_group].reshape(-1, *rest)
    k, v = (by_group[:, per_group + i].reshape(-1, *rest) for i in (0, 1))
    return np.concatenate([q, k, v])


def scaled_weights(name: str, array: np.ndarray, config: ArchitectureConfig) -> np.ndarray:
    """The config's constant multipliers folded into the weights they apply to
    (config/weight_scales.py)."""
    for scale in config.weight_scales:
        if scale.applies(name):
            array = scale.apply(array)
    return array


#: CodeGen's qkv_proj rows: 4 model-parallel shards, each [q, v, k] (CodeGenAttention.mp_num).
CODEGEN_SHARDS = 4


def qkv_blocks_from_codegen_shards(
    name: str, array: np.ndarray, config: ArchitectureConfig
) -> np.ndarray:
    """CodeGen's fused qkv_proj, stored as CODEGEN_SHARDS shards of [q, v, k] rows (a quarter of
    each projection per shard), regrouped into the [q | k | v] blocks of the packed projection."""
    if not re.search(PACKED_QKV, name):
        return array
    rest = array.shape[1:]
    shards = array.reshape(CODEGEN_SHARDS, 3, -1, *rest)
    q, v, k = (shards[:, i].reshape(-1, *rest) for i in range(3))
    return np.concatenate([q, k, v])


QK_PROJECTIONS = r"\.self_attn\.(q|k)_proj\.(weight|bias)$"


def negated_second_rotary_halves(
    name: str, array: np.ndarray, config: ArchitectureConfig
) -> np.ndarray:
    """nanochat's rotate_half returns [x2, -x1], turning q and k by -angle: that is P R(angle) P
    with P negating the second half of each head's rotary channels. P commutes with its
    weightless q/k RMSNorm and drops out of q . k, so q/k projections whose second halves are
    negated give the same scores under the usual rotation."""
    if not re.search(QK_PROJECTIONS, name):
        return array
    head_dim, rotary = config.head_dim, config.rotary_dim
    by_head = array.astype(np.float32).reshape(-1, head_dim, *array.shape[1:])
    by_head[:, rotary // 2 : rotary] *= -1.0
    return by_head.reshape(array.shape)
