"""ctrl (Salesforce CTRL): pre-LN layers of biased Wq/Wk/Wv/dense attention and a ReLU FC MLP
(`ffn.0`, `ffn.2`), token embeddings times sqrt(n_embd) plus sinusoidal positions from row 0 in
the layout of "Attention Is All You Need" (config/embedding_layout.py's "vaswani"), a tied head
with a bias of its own.

CTRL's layer norms keep eps 1e-6 whatever config.json says (EncoderLayer); only its final norm
reads `layer_norm_epsilon`, so another value is refused rather than misread. Defaults are
CTRLConfig's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.embedding_layout import EmbeddingLayout
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.heads import kv_head_per_head, split_hidden

#: The epsilon of CTRL's layer norms (EncoderLayer's nn.LayerNorm(eps=1e-6)).
_LAYER_EPS = 1e-6


def _layer_eps(raw: Mapping[str, Any]) -> float:
    """1e-6, which the final norm reads from layer_norm_epsilon and every layer keeps."""
    eps = fields.number(raw.get("layer_norm_epsilon"), "layer_norm_epsilon", _LAYER_EPS)
    if eps != _LAYER_EPS:
        raise UnsupportedModelError(
            f"config.json: layer_norm_epsilon is {eps!r}; ctrl models are supported with 1e-6 "
            "only (CTRL's layer norms keep 1e-6, its final norm alone reads this key)"
        )
    return _LAYER_EPS


def _ctrl_layout(raw: Mapping[str, Any]) -> EmbeddingLayout:
    """CTRL's sinusoids; an odd n_embd gives its sines one channel more than its cosines."""
    hidden = fields.require(raw, "hidden_size")
    if hidden % 2:
        raise ConfigError(f"config.json: field 'n_embd' must be even for ctrl, found {hidden}")
    return EmbeddingLayout(sinusoids="vaswani")


CTRL = FamilyAdapter(
    model_type="ctrl",
    config_aliases={
        "n_embd": "hidden_size",
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_positions": "max_position_embeddings",
        "dff": "intermediate_size",
    },
    config_defaults={"max_position_embeddings": 256, "tie_word_embeddings": True},
    config_overrides={
        "head_dim": split_hidden,
        "num_key_value_heads": kv_head_per_head,
        "norm_type": "layer",
        "norm_eps": _layer_eps,
        "gated_mlp": False,
        "hidden_act": "relu",
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "lm_head_bias": True,
        "position_embedding": "sinusoidal",
        "embedding_layout": _ctrl_layout,
        "embedding_multiplier": lambda raw: math.sqrt(fields.require(raw, "hidden_size")),
    },
    weight_renames=(
        (r"\.self_attn\.q_proj\.", ".multi_head_attention.Wq."),
        (r"\.self_attn\.k_proj\.", ".multi_head_attention.Wk."),
        (r"\.self_attn\.v_proj\.", ".multi_head_attention.Wv."),
        (r"\.self_attn\.o_proj\.", ".multi_head_attention.dense."),
        (r"\.mlp\.fc1\.", ".ffn.0."),
        (r"\.mlp\.fc2\.", ".ffn.2."),
        (r"\.input_layernorm\.", ".layernorm1."),
        (r"\.post_attention_layernorm\.", ".layernorm2."),
        (r"^model\.layers\.", "transformer.h."),
        (r"^model\.embed_tokens\.", "transformer.w."),
        (r"^model\.norm\.", "transformer.layernorm."),
    ),
)
