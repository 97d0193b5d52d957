"""RecurrentGemma (`recurrent_gemma`, Griffin): residual blocks of a temporal block and a
gated MLP.

- The temporal block follows `block_types` repeated over the layers (default recurrent,
  recurrent, attention): an RG-LRU block (components/rglru.py, its states declared in
  config/recurrent.py) or local multi-query attention over the last `attention_window_size`
  positions ("sliding_attention": the full cache, a windowed mask, as the other sliding rows),
  rotating the first half of each head (`partial_rotary_factor` 0.5), heads of hidden_size /
  num_attention_heads channels whatever `head_dim` says, o_proj always biased.
- The MLP is gelu_tanh(gate) * up with biases, intermediate_size // 2 wide.
- Norms scale by 1 + weight (as gemma's); embeddings are scaled by sqrt(hidden_size) rounded
  to bfloat16 (RecurrentGemmaModel's `normalizer` buffer is bfloat16 in any model dtype); the
  logits are soft-capped at `logits_soft_cap`.
- Module names: `temporal_pre_norm`, `temporal_block`, `channel_pre_norm`, `mlp_block`,
  `final_norm`. config.json has no length: og's context defaults to the 8192 positions
  Griffin trained on (the package's `context_length` sets another).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mobius_genai.config import fields
from mobius_genai.config.rglru import read_rglru
from mobius_genai.config.rope import RopeConfig, parse_rope
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_PARTIAL_ROTARY
from mobius_genai.models.families.preprocess import NORM_WEIGHTS, offset_norm_weights
from mobius_genai.models.families.readers import gemma_activation
from mobius_genai.models.families.scales import softcap

#: RecurrentGemmaConfig's block kinds → this package's layer types.
_BLOCKS = {"recurrent": "rglru", "attention": "sliding_attention"}
_DEFAULT_BLOCKS = ("recurrent", "recurrent", "attention")


def recurrent_gemma_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """`block_types` repeated over the layers (RecurrentGemmaConfig.layers_block_type)."""
    blocks = raw.get("block_types") or list(_DEFAULT_BLOCKS)
    if not isinstance(blocks, list) or any(block not in _BLOCKS for block in blocks):
        raise ConfigError(
            f"config.json: block_types is {blocks!r}; accepted: a list of {list(_BLOCKS)}"
        )
    layers = fields.require(raw, "num_hidden_layers")
    return tuple(_BLOCKS[blocks[i % len(blocks)]] for i in range(layers))


def bfloat16_sqrt_hidden(raw: Mapping[str, Any]) -> float:
    """sqrt(hidden_size) rounded to the nearest bfloat16, as RecurrentGemmaModel keeps it."""
    bits = np.array([math.sqrt(fields.require(raw, "hidden_size"))], np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round half to even
    return float(rounded.view(np.float32)[0])


def _head_dim(raw: Mapping[str, Any]) -> int:
    """hidden_size / num_attention_heads: RecurrentGemmaConfig sets it whatever head_dim says."""
    return fields.require(raw, "hidden_size") // fields.require(raw, "num_attention_heads")


def _mlp_width(raw: Mapping[str, Any]) -> int:
    """RecurrentGemmaMlp's width: half of intermediate_size."""
    return fields.require(raw, "intermediate_size") // 2


def default_rope(raw: Mapping[str, Any]) -> RopeConfig:
    """The rope, refused unless the default one (RecurrentGemmaRotaryEmbedding builds no
    other)."""
    rope, _ = parse_rope(raw)
    if rope.type != "default":
        raise UnsupportedModelError(
            f"config.json: rope_parameters' rope_type is {rope.type!r}; accepted for "
            "recurrent_gemma: 'default' (RecurrentGemmaRotaryEmbedding builds no other)"
        )
    return rope


RECURRENT_GEMMA = FamilyAdapter(
    model_type="recurrent_gemma",
    config_defaults={
        "num_hidden_layers": 26,
        "vocab_size": 256_000,
        "hidden_size": 2560,
        "intermediate_size": 3 * 2560,
        "num_attention_heads": 10,
        "max_position_embeddings": 8192,
        "partial_rotary_factor": 0.5,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    },
    config_overrides={
        "layer_types": recurrent_gemma_layer_types,
        "sliding_window": lambda raw: fields.integer(
            raw.get("attention_window_size"), "attention_window_size", 2048
        ),
        "head_dim": _head_dim,
        "intermediate_size": _mlp_width,
        "hidden_act": gemma_activation,
        "o_bias": True,
        "mlp_bias": True,
        "embedding_multiplier": bfloat16_sqrt_hidden,
        "final_logit_softcapping": softcap("logits_soft_cap", 30.0),
        "rope": default_rope,
        "rglru": read_rglru,
    },
    weight_renames=(
        (r"\.self_attn\.", ".temporal_block."),
        (r"\.input_layernorm\.", ".temporal_pre_norm."),
        (r"\.post_attention_layernorm\.", ".channel_pre_norm."),
        (r"\.mlp\.", ".mlp_block."),
        (r"^model\.norm\.", "model.final_norm."),
    ),
    preprocess_weight=offset_norm_weights,
    preprocessed_weights=NORM_WEIGHTS,
    family_keys=READS_PARTIAL_ROTARY,
)
