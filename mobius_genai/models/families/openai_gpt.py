"""openai-gpt (OpenAI's GPT-1, openai-community/openai-gpt): GPT-2's weights (Conv1D c_attn,
c_proj, c_fc stored [in, out]) in post-LN blocks, h = ln_1(x + attn(x)), out = ln_2(h + mlp(h))
(the `post_residual` placement), learned positions from row 0 (`positions_embed`), no final
norm, a tied head.

Its classes read neither n_inner (the MLP is always 4 * n_embd wide) nor scale_attn_weights
(scores always divided by sqrt(head_dim)); `afn` names the activation from its own table, where
"gelu" is the tanh approximation. Defaults are OpenAIGPTConfig's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.embedding_layout import EmbeddingLayout
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.gpt2_names import (
    GPT2_BLOCK,
    GPT2_BLOCK_NAMES,
    GPT2_BUFFERS,
    GPT2_FUSED_QKV,
)
from mobius_genai.models.families.heads import kv_head_per_head

#: modeling_openai's ACT_FNS, as our activation names.
_AFN = {"gelu": "gelu_new", "relu": "relu", "silu": "silu", "swish": "silu"}


def _activation(raw: Mapping[str, Any]) -> str:
    afn = raw.get("afn", "gelu")
    if afn not in _AFN:
        raise ConfigError(f"config.json: field 'afn' must be one of {sorted(_AFN)}, found {afn!r}")
    return _AFN[afn]


OPENAI_GPT = FamilyAdapter(
    model_type="openai-gpt",
    config_aliases={
        "n_embd": "hidden_size",
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_positions": "max_position_embeddings",
    },
    config_defaults={
        "max_position_embeddings": 512,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
        # OpenAIGPTConfig has no such key: the MLP is always 4 * n_embd wide
        "intermediate_size": lambda raw: 4 * fields.require(raw, "hidden_size"),
    },
    config_overrides={
        **GPT2_BLOCK,
        "attention_scale": None,
        "num_key_value_heads": kv_head_per_head,
        "hidden_act": _activation,
        "norm_placement": "post_residual",
        "embedding_layout": EmbeddingLayout(final_norm=False),
    },
    fused_weights=(GPT2_FUSED_QKV,),
    weight_renames=(
        *GPT2_BLOCK_NAMES,
        (r"\.input_layernorm\.", ".ln_1."),
        (r"\.post_attention_layernorm\.", ".ln_2."),
        (r"^model\.layers\.", "transformer.h."),
        (r"^model\.embed_tokens\.", "transformer.tokens_embed."),
        (r"^model\.embed_positions\.", "transformer.positions_embed."),
    ),
    in_out_weights=r"\.(c_attn|c_proj|c_fc)\.weight$",
    optional_prefix="transformer.",
    unused_weights=GPT2_BUFFERS,
)
