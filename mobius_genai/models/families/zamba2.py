"""Zamba2 (`zamba2`: Zyphra's Zamba2-1.2B, 2.7B, 7B): Mamba2 layers, and "hybrid" layers that
first invoke a shared transformer block (config/shared_blocks.py, components/shared_blocks.py).

A hybrid layer's cache is its invocation's key and value, then its Mamba2 states (the layout
of Falcon-H1's layers: `parallel_recurrent`), so the task, genai_config and validation read it
unchanged; the stack itself is SharedBlockTextModel (models/causal_lm.py). The blocks'
attention reads 2 x hidden channels in heads of 2 x hidden / heads and scales scores by
(head_dim / 2) ** -0.5; rotary only with `use_mem_rope`. The Mamba2 mixer is Bamba's
(Granite-4.0-H's in_proj layout), its conv biased and SiLU whatever `use_conv_bias` and
`hidden_act` say (hidden_act is the blocks' MLP's), dt unclamped: transformers clamps it at
`time_step_min` in its prefill only, not in its decode steps (as config/mamba2.py says of
`time_step_limit`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.mamba2 import Mamba2Config, Mamba2Keys, read_mamba2
from mobius_genai.config.shared_blocks import SharedBlocks
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter

#: Zamba2's layer kinds as config.json spells them (transformers 5 and the hub's legacy
#: "mamba") → this package's; a hybrid layer attends (its block) and runs Mamba2 after it.
_KINDS = {"linear_attention": "mamba2", "mamba": "mamba2", "hybrid": "full_attention"}

#: Zamba2Config's `layers_block_type` when absent (54 layers: Zamba2-2.7B's).
_DEFAULT_BLOCKS = (
    (["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"])
    + ["mamba"] * 3
    + ["hybrid"]
    + ["mamba"] * 2
)


def _blocks(raw: Mapping[str, Any]) -> list[str]:
    """config.json's `layers_block_type`, one known kind per layer."""
    kinds = raw.get("layers_block_type")
    if kinds is None:
        kinds = _DEFAULT_BLOCKS
    layers = fields.require(raw, "num_hidden_layers")
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in _KINDS for k in kinds):
        raise ConfigError(
            f"config.json: layers_block_type is {kinds!r}; accepted: a list of {layers} of "
            f"{list(_KINDS)}"
        )
    return kinds


def zamba2_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(_KINDS[kind] for kind in _blocks(raw))


def _hybrid_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(i for i, kind in enumerate(_blocks(raw)) if kind == "hybrid")


def zamba2_head_dim(raw: Mapping[str, Any]) -> int:
    """Zamba2Config's attention_head_dim: 2 x hidden_size / heads, whatever config.json says."""
    return 2 * fields.require(raw, "hidden_size") // fields.require(raw, "num_attention_heads")


def zamba2_shared_blocks(raw: Mapping[str, Any]) -> SharedBlocks:
    """The shared blocks; adapters on q, k and v (`use_shared_attention_adapter`) only where
    the key/value heads are the query heads (transformers' adapters are as wide as q)."""
    adapted = fields.flag(
        raw.get("use_shared_attention_adapter"), "use_shared_attention_adapter", False
    )
    heads = fields.require(raw, "num_attention_heads")
    kv_heads = fields.integer(raw.get("num_key_value_heads"), "num_key_value_heads", heads)
    if adapted and kv_heads != heads:
        raise UnsupportedModelError(
            f"config.json: num_key_value_heads is {kv_heads} with use_shared_attention_adapter; "
            f"accepted: num_attention_heads ({heads}), the adapters' width"
        )
    hybrid = _hybrid_layers(raw)
    return SharedBlocks(
        count=fields.integer(raw.get("num_mem_blocks"), "num_mem_blocks", 1),
        adapter_rank=fields.integer(raw.get("adapter_rank"), "adapter_rank", 128),
        attention_adapters=adapted,
        hybrid_layers=hybrid,
        invocations=len(hybrid),
    )


_ZAMBA2_KEYS = Mamba2Keys(
    heads=("n_mamba_heads", 8),
    head_dim=("mamba_headdim", "auto"),
    state_size=("mamba_d_state", 64),
    groups=("mamba_ngroups", 1),
    conv_kernel_size=("mamba_d_conv", 4),
    expand=("mamba_expand", 2),
    conv_bias=("use_conv_bias", True),
    proj_bias=("add_bias_linear", False),
)


def zamba2_mamba2(raw: Mapping[str, Any]) -> Mamba2Config:
    """Zamba2MambaMixer's sizes: a biased SiLU conv always, in_proj and out_proj biased with
    `add_bias_linear`, the head size expand x hidden / heads (recomputed, as the class does)."""
    sizes = read_mamba2({**raw, "hidden_act": "silu", "mamba_headdim": "auto"}, _ZAMBA2_KEYS)
    return dataclasses.replace(sizes, conv_bias=True)


def _long_context(raw: Mapping[str, Any]) -> bool:
    return fields.flag(raw.get("use_long_context"), "use_long_context", False)


ZAMBA2 = FamilyAdapter(
    model_type="zamba2",
    config_defaults={
        "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
        "hidden_act": "gelu",
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    config_overrides={
        "layer_types": zamba2_layer_types,
        "parallel_recurrent": "mamba2",
        "head_dim": zamba2_head_dim,
        "attention_scale": lambda raw: (zamba2_head_dim(raw) / 2) ** -0.5,
        "no_rope_layers": lambda raw: (
            ()
            if fields.flag(raw.get("use_mem_rope"), "use_mem_rope", False)
            else tuple(range(fields.require(raw, "num_hidden_layers")))
        ),
        "qkv_bias": False,
        "o_bias": False,
        "mlp_bias": lambda raw: fields.flag(raw.get("add_bias_linear"), "add_bias_linear", False),
        "max_position_embeddings": lambda raw: (
            16384 if _long_context(raw) else fields.require(raw, "max_position_embeddings")
        ),
        "mamba2": zamba2_mamba2,
        "shared_blocks": zamba2_shared_blocks,
    },
    weight_renames=((r"^model\.norm\.", "model.final_layernorm."),),
)
