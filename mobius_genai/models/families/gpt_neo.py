"""gpt_neo (EleutherAI's GPT-Neo 125M-2.7B): GPT-2's layer with unbiased q/k/v projections
(out_proj keeps its bias), unscaled attention scores and local layers attending over the last
`window_size` tokens.

The local layers are the sliding-window layers of `attention_types` ([[kinds, repeats], ...],
expanded as GPTNeoConfig expands it into attention_layers). Defaults are GPTNeoConfig's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.gpt2_names import GPT2_BLOCK, GPT2_DEFAULTS, GPT2_LAYOUT
from mobius_genai.models.families.heads import kv_head_per_head

#: GPTNeoConfig's attention_types when config.json has none: global and local alternating.
_ALTERNATING = [[["global", "local"], 12]]
_LAYER_TYPE = {"global": "full_attention", "local": "sliding_attention"}


def _gpt_neo_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """attention_types expanded into one kind per layer; GPTNeoConfig requires one per layer."""
    types = raw.get("attention_types") or _ALTERNATING
    num_layers = fields.require(raw, "num_hidden_layers")
    try:
        kinds = [kind for group, repeats in types for _ in range(repeats) for kind in group]
        layer_types = [_LAYER_TYPE[kind] for kind in kinds]
    except (TypeError, ValueError, KeyError):
        layer_types = []
    if len(layer_types) != num_layers:
        raise ConfigError(
            f"config.json: field 'attention_types' must expand to one 'global' or 'local' per "
            f"layer ({num_layers}) as [[kinds, repeats], ...], found {types!r}"
        )
    return layer_types


GPT_NEO = FamilyAdapter(
    model_type="gpt_neo",
    config_aliases={
        "num_heads": "num_attention_heads",
        "num_layers": "num_hidden_layers",
        "activation_function": "hidden_act",
        "window_size": "sliding_window",
    },
    config_defaults={
        **GPT2_DEFAULTS,
        "hidden_act": "gelu_new",
        "max_position_embeddings": 2048,
        "sliding_window": 256,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    },
    config_overrides={
        **GPT2_BLOCK,
        "num_key_value_heads": kv_head_per_head,
        "qkv_bias": False,
        "attention_scale": 1.0,  # GPTNeoSelfAttention never divides by sqrt(head_dim)
        "layer_types": _gpt_neo_layer_types,
    },
    weight_renames=(
        (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
        (r"\.self_attn\.", ".attn.attention."),
        (r"\.mlp\.fc1\.", ".mlp.c_fc."),
        (r"\.mlp\.fc2\.", ".mlp.c_proj."),
        (r"\.post_attention_layernorm\.", ".ln_2."),
        (r"^model\.embed_positions\.", "transformer.wpe."),
        *GPT2_LAYOUT,
    ),
    optional_prefix="transformer.",
    # the causal and local masks older checkpoints saved (transformers rebuilds them)
    unused_weights=(r"\.attn\.attention\.(bias|masked_bias)$",),
)
