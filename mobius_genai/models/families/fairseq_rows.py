"""Decoders in fairseq's layout: opt (facebook/opt-125m ... 66b, galactica), xglm
(facebook/xglm-*) and biogpt (microsoft/biogpt, BioGPT-Large).

Both add absolute positions to the token embeddings from row 2 of their table on
(config/embedding_layout.py's offset): OPT's table is learned, XGLM's sinusoidal. OPT's switches:
post-LN layers without a final norm when `do_layer_norm_before` is false (opt-350m), a token
table narrower than the stack (`word_embed_proj_dim`: project_in, project_out), `enable_bias`,
`layer_norm_elementwise_affine`, `_remove_final_layer_norm`. XGLM multiplies the token
embeddings by sqrt(d_model) under `scale_embedding`. BioGPT is XGLM's pre-LN layer with OPT's
learned positions (from row 2) and XGLM's `scale_embedding`; its LayerNorms keep nn.LayerNorm's
epsilon, whatever config.json's `layer_norm_eps` says. Defaults are OPTConfig's, XGLMConfig's
and BioGptConfig's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.embedding_layout import EmbeddingLayout
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.heads import kv_head_per_head, split_hidden
from mobius_genai.models.families.readers import switch

#: fairseq's position tables start at row 2 (its padding index was 1).
_POSITION_OFFSET = 2
#: nn.LayerNorm's default epsilon, which both classes keep (no config.json key sets it).
_LAYER_NORM_EPS = 1e-5

#: The layer both families share: LayerNorms, biased q/k/v/out and an FC MLP, one key/value
#: head per head.
_FAIRSEQ_BLOCK = {
    "head_dim": split_hidden,
    "num_key_value_heads": kv_head_per_head,
    "norm_eps": _LAYER_NORM_EPS,
    "gated_mlp": False,
}
#: Their layer's tensor names; `model.norm` is each family's own.
_FAIRSEQ_LAYER = (
    (r"\.self_attn\.o_proj\.", ".self_attn.out_proj."),
    (r"\.mlp\.fc", ".fc"),
    (r"\.input_layernorm\.", ".self_attn_layer_norm."),
    (r"\.post_attention_layernorm\.", ".final_layer_norm."),
)


def _pre_ln(raw: Mapping[str, Any]) -> bool:
    return fields.flag(raw.get("do_layer_norm_before"), "do_layer_norm_before", True)


def _opt_placement(raw: Mapping[str, Any]) -> str:
    """Pre-LN layers (125m, 1.3b and up), or norms of the residual sums (350m)."""
    return "pre" if _pre_ln(raw) else "post_residual"


def _opt_norm(raw: Mapping[str, Any]) -> str:
    affine = "layer_norm_elementwise_affine"
    return "layer" if fields.flag(raw.get(affine), affine, True) else "layer_no_affine"


def _opt_layout(raw: Mapping[str, Any]) -> EmbeddingLayout:
    """Offset positions; project_in/out when word_embed_proj_dim differs from hidden_size; a
    final norm only in pre-LN models that keep it (OPTDecoder's final_layer_norm)."""
    hidden = fields.require(raw, "hidden_size")
    width = fields.integer(raw.get("word_embed_proj_dim"), "word_embed_proj_dim", hidden)
    removed = fields.flag(raw.get("_remove_final_layer_norm"), "_remove_final_layer_norm", False)
    return EmbeddingLayout(
        position_offset=_POSITION_OFFSET,
        width=None if width == hidden else width,
        final_norm=_pre_ln(raw) and not removed,
    )


def _embedding_scale(raw: Mapping[str, Any]) -> float:
    scaled = fields.flag(raw.get("scale_embedding"), "scale_embedding", True)
    return math.sqrt(fields.require(raw, "hidden_size")) if scaled else 1.0


OPT = FamilyAdapter(
    model_type="opt",
    config_aliases={"ffn_dim": "intermediate_size", "activation_function": "hidden_act"},
    config_defaults={
        "hidden_act": "relu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    config_overrides={
        **_FAIRSEQ_BLOCK,
        "norm_type": _opt_norm,
        "norm_placement": _opt_placement,
        "qkv_bias": switch("enable_bias", True),
        "o_bias": switch("enable_bias", True),
        "mlp_bias": switch("enable_bias", True),
        "position_embedding": "learned",
        "embedding_layout": _opt_layout,
    },
    weight_renames=(
        *_FAIRSEQ_LAYER,
        (r"^model\.norm\.", "model.final_layer_norm."),
        (r"^model\.", "model.decoder."),
    ),
    # checkpoints saved from OPTModel name tensors "decoder.*"
    optional_prefix="model.",
)

XGLM = FamilyAdapter(
    model_type="xglm",
    config_aliases={
        "d_model": "hidden_size",
        "num_layers": "num_hidden_layers",
        "attention_heads": "num_attention_heads",
        "ffn_dim": "intermediate_size",
        "activation_function": "hidden_act",
    },
    config_defaults={
        "hidden_act": "gelu",
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    config_overrides={
        **_FAIRSEQ_BLOCK,
        "norm_type": "layer",
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "position_embedding": "sinusoidal",
        "embedding_layout": EmbeddingLayout(position_offset=_POSITION_OFFSET),
        "embedding_multiplier": _embedding_scale,
    },
    refused_keys=("add_cross_attention",),
    weight_renames=(*_FAIRSEQ_LAYER, (r"^model\.norm\.", "model.layer_norm.")),
    # the sinusoid table fairseq-converted checkpoints may keep (transformers recomputes it)
    unused_weights=(r"^model\.embed_positions\.",),
)

BIOGPT = FamilyAdapter(
    model_type="biogpt",
    config_defaults={
        "hidden_act": "gelu",
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
    },
    # XGLM's layer, offset and scale_embedding, with a learned position table
    config_overrides={**XGLM.config_overrides, "position_embedding": "learned"},
    weight_renames=(
        *_FAIRSEQ_LAYER,
        (r"^model\.norm\.", "model.layer_norm."),
        (r"^model\.", "biogpt."),
        (r"^lm_head\.", "output_projection."),
    ),
)

FAIRSEQ_FAMILIES = (OPT, XGLM, BIOGPT)
