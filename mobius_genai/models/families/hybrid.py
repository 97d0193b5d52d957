"""Config reads and weight changes of hybrid families, whose layers mix attention with
recurrent blocks (LFM2's short convolutions, Qwen3.5's and Qwen3-Next's gated delta nets,
Granite-4.0-H's Mamba2 layers)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from mobius_genai.checkpoint.grouped import GroupedWeight
from mobius_genai.config import ArchitectureConfig, fields
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.moe_routing import GroupRouting
from mobius_genai.config.rope import RopeConfig, parse_rope
from mobius_genai.errors import ConfigError


def lfm2_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Lfm2Config without `layer_types`: attention at `full_attn_idxs` (all layers when absent),
    short convolutions elsewhere."""
    num_layers = fields.require(raw, "num_hidden_layers")
    indices = raw.get("full_attn_idxs")
    if indices is None:
        indices = range(num_layers)
    elif not isinstance(indices, list) or not all(fields.is_int(i) for i in indices):
        raise ConfigError(
            f"config.json: field 'full_attn_idxs' must be a list of layer indices, found "
            f"{indices!r}"
        )
    return ["full_attention" if i in indices else "conv" for i in range(num_layers)]


def lfm2_intermediate_size(raw: Mapping[str, Any]) -> int:
    """Lfm2MLP's width: with `block_auto_adjust_ff_dim` (default true) 2/3 of
    `intermediate_size`, times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`."""
    size = fields.require(raw, "intermediate_size")
    if not fields.flag(raw.get("block_auto_adjust_ff_dim"), "block_auto_adjust_ff_dim", True):
        return size
    size = int(2 * size / 3)
    multiplier = fields.number(raw.get("block_ffn_dim_multiplier"), "block_ffn_dim_multiplier")
    if multiplier is None:
        return size
    multiple = fields.integer(raw.get("block_multiple_of"), "block_multiple_of", 256)
    size = int(multiplier * size)
    return multiple * ((size + multiple - 1) // multiple)


#: Lfm2MoeTopKRouter's renormalization: weight / (sum of the picked weights + 1e-6).
_LFM2_MOE_EPSILON = 1e-6


def lfm2_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Lfm2MoeSparseMoeBlock after the first `num_dense_layers` (2 when absent): experts picked
    by sigmoid(logits) + `expert_bias` (`use_expert_bias`, default true), weighted by the
    uncorrected sigmoids, renormalized (`norm_topk_prob`, default true) and scaled by
    `routed_scaling_factor` (config/moe_routing.py with one group)."""
    moe = read_moe(
        raw,
        MoeKeys(
            num_experts="num_experts",
            intermediate="moe_intermediate_size",
            normalize_default=True,
        ),
    )
    num_layers = fields.require(raw, "num_hidden_layers")
    dense = fields.integer(raw.get("num_dense_layers"), "num_dense_layers", 2, positive=False)
    routing = GroupRouting(
        scoring="sigmoid",
        correction_bias=fields.flag(raw.get("use_expert_bias"), "use_expert_bias", True),
        scaling=fields.number(raw.get("routed_scaling_factor"), "routed_scaling_factor", 1.0),
        epsilon=_LFM2_MOE_EPSILON,
    )
    return dataclasses.replace(
        moe, sparse_layers=tuple(range(dense, num_layers)), group_routing=routing
    )


def qwen3_5_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Qwen3_5TextConfig without `layer_types`: every `full_attention_interval`-th layer (4 when
    absent) attends, the others are gated delta nets."""
    num_layers = fields.require(raw, "num_hidden_layers")
    interval = fields.integer(raw.get("full_attention_interval"), "full_attention_interval", 4)
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(num_layers)
    ]


#: Granite-4.0-H's layer kinds as the hub ("mamba", "attention") and transformers 5
#: ("linear_attention", "full_attention") spell them → this package's.
_GRANITE_HYBRID_KINDS = {
    "mamba": "mamba2",
    "linear_attention": "mamba2",
    "attention": "full_attention",
    "full_attention": "full_attention",
}


def granite_hybrid_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """GraniteMoeHybridConfig's `layer_types` (`layers_block_type`; all Mamba2 when absent)."""
    num_layers = fields.require(raw, "num_hidden_layers")
    kinds = raw.get("layer_types") or raw.get("layers_block_type") or ["mamba"] * num_layers
    if not isinstance(kinds, list) or any(kind not in _GRANITE_HYBRID_KINDS for kind in kinds):
        raise ConfigError(
            f"config.json: layer_types is {kinds!r}; accepted: a list of "
            f"{list(_GRANITE_HYBRID_KINDS)}"
        )
    return [_GRANITE_HYBRID_KINDS[kind] for kind in kinds]


def granite_hybrid_no_rope(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """Every layer unless `position_embedding_type` is "rope" (Granite-4.0-H's is "nope")."""
    if raw.get("position_embedding_type") == "rope":
        return ()
    return tuple(range(fields.require(raw, "num_hidden_layers")))


_GRANITE_HYBRID_MOE = MoeKeys(
    num_experts="num_local_experts",
    normalize=True,  # a softmax over the top-k logits
    shared_expert="shared_intermediate_size",
)


def granite_hybrid_moe(raw: Mapping[str, Any]) -> MoeConfig | None:
    """Experts beside the shared MLP, or None with `num_local_experts` 0: the shared MLP alone
    is the layer's MLP (the dense Granite-4.0 layouts)."""
    experts = fields.integer(raw.get("num_local_experts"), "num_local_experts", positive=False)
    return None if experts == 0 else read_moe(raw, _GRANITE_HYBRID_MOE)


def granite_hybrid_mlp_size(raw: Mapping[str, Any]) -> int:
    """The dense MLP's width: the shared MLP's without experts, else the experts'."""
    key = "shared_intermediate_size" if granite_hybrid_moe(raw) is None else "intermediate_size"
    return fields.require(raw, key)


def qwen3_5_text_rope(raw: Mapping[str, Any]) -> RopeConfig:
    """Qwen3.5's text rope without the vision model's `mrope_section` (hub configs keep it):
    transformers' text decoder gives the three mrope axes the same positions, which is the
    plain 1-D rope, and onnxruntime-genai feeds qwen3_5_text 1-D position_ids."""
    rope, _ = parse_rope(raw)
    return dataclasses.replace(rope, mrope_section=None)


#: Qwen3.5's norms that scale by 1 + weight: all but the gated norm of the gated delta nets
#: (the MTP head's pre-fc norms too: vLLM's GemmaRMSNorm).
QWEN3_5_OFFSET_NORMS = r"(?<!linear_attn\.)norm(_embedding|_hidden)?\.weight$"


def qwen3_5_norm_weights(name: str, array: np.ndarray, config: ArchitectureConfig) -> np.ndarray:
    """Store 1 + weight as the scale of the norms that use it (Qwen3_5RMSNorm)."""
    if re.search(QWEN3_5_OFFSET_NORMS, name):
        return array.astype(np.float32) + 1.0
    return array


def _per_key_head(config: ArchitectureConfig) -> tuple[int, dict[str, int]]:
    """Qwen3-Next's packing: one block per key head, of q, k (key_dim) and v, z (value_dim)
    rows, and of b, a (one row per value head)."""
    sizes = config.linear_attention
    rows = {"q": sizes.key_dim, "k": sizes.key_dim, "v": sizes.value_dim, "z": sizes.value_dim}
    return sizes.key_heads, {**rows, "b": sizes.value_heads, "a": sizes.value_heads}


#: Qwen3-Next's in_proj_qkvz ([q_h | k_h | v_h | z_h] per key head h) and in_proj_ba
#: ([b_h | a_h]) as qwen3_5_text's in_proj_qkv ([q | k | v]), in_proj_z, in_proj_b, in_proj_a.
QWEN3_NEXT_PACKED = (
    GroupedWeight(
        pattern=r"\.linear_attn\.in_proj_(?P<part>qkv|z)\.weight$",
        fused=r".linear_attn.in_proj_qkvz.weight",
        segments=("q", "k", "v", "z"),
        parts={"qkv": ("q", "k", "v"), "z": ("z",)},
        sizes=_per_key_head,
    ),
    GroupedWeight(
        pattern=r"\.linear_attn\.in_proj_(?P<part>b|a)\.weight$",
        fused=r".linear_attn.in_proj_ba.weight",
        segments=("b", "a"),
        parts={"b": ("b",), "a": ("a",)},
        sizes=_per_key_head,
    ),
)
