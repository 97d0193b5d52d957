"""Mamba, FalconMamba and Jamba: the families built on the Mamba1 mixer (components/mamba1.py),
as rows of the family table (hybrid_rows.py) and what they read.

- **Mamba** (`mamba`): every layer is one block, h = x + mixer(norm(x)) (`one_block_layers`),
  no attention and no MLP: a decoder with no KV cache at all, only conv and scan states, which
  onnxruntime-genai 0.18 runs as Nemotron-H's attention-free layouts (its generic decoder
  derives the states' names from the KV patterns genai_config still names). Tensors stay under
  the hub's `backbone.` (`embeddings`, each layer's `norm` and `mixer`, `norm_f`).
  config.json has no attention keys: heads of 64 channels spanning the hidden size (one head
  as wide as it where 64 does not divide it) stand in for genai_config's required sizes, which
  no graph input reads (a single head of FalconMamba-7B's 4096 channels would pass the head
  size any attention has); and no length: the positions og
  may generate default to those the checkpoints were trained on (2048; the package's
  `context_length` sets another).
- **FalconMamba** (`falcon_mamba`): Mamba's layers with dt, B and C RMS-normalized without
  weights (`mixer_rms_eps`) before dt_proj and the scan.
- **Jamba** (`jamba`): Mamba1 mixers with dt, B and C RMS-normalized with weights, and llama
  attention without rotary (JambaAttention applies none) in the layers `i % attn_layer_period
  == attn_layer_offset`; after each a gated MLP, or in the layers `i % expert_layer_period ==
  expert_layer_offset` MoE experts routed by the top-k of a softmax, not renormalized
  (JambaTopKRouter); norms named as Falcon-H1's.

transformers keeps the residual stream in float32 when `residual_in_fp32` (Mamba's and
FalconMamba's default): so does a float16 or bfloat16 bundle (`residual_in_float32`). Jamba
has no such key: its residuals are added in the model dtype, as JambaMambaDecoderLayer adds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.mamba1 import FALCON_MAMBA_KEYS, JAMBA_KEYS, MAMBA_KEYS, mamba1_reader
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import UNBIASED_ATTENTION
from mobius_genai.models.families.mamba2_hybrids import FALCON_H1
from mobius_genai.models.families.readers import when_absent


def _all_mixers(raw: Mapping[str, Any]) -> tuple[str, ...]:
    return ("mamba",) * fields.require(raw, "num_hidden_layers")


#: The channels of each stand-in attention head of a model without attention.
_STAND_IN_HEAD = 64


def stand_in_heads(raw: Mapping[str, Any]) -> int:
    """The attention heads genai_config names for a model without attention: heads of
    `_STAND_IN_HEAD` channels spanning the hidden size, else one head as wide as it."""
    hidden = fields.require(raw, "hidden_size")
    return hidden // _STAND_IN_HEAD if hidden % _STAND_IN_HEAD == 0 else 1


def _mamba_intermediate(raw: Mapping[str, Any]) -> int:
    """MambaConfig's intermediate_size (the mixer's; there is no MLP): expand x hidden_size."""
    return fields.integer(raw.get("expand"), "expand", 2) * fields.require(raw, "hidden_size")


MAMBA = FamilyAdapter(
    model_type="mamba",
    config_defaults={
        "num_attention_heads": stand_in_heads,
        "max_position_embeddings": 2048,
        "intermediate_size": _mamba_intermediate,
        "tie_word_embeddings": True,  # MambaConfig's default
    },
    config_overrides={
        "layer_types": _all_mixers,
        "one_block_layers": True,
        "residual_in_float32": lambda raw: fields.flag(
            raw.get("residual_in_fp32"), "residual_in_fp32", True
        ),
        "norm_eps": lambda raw: fields.number(
            raw.get("layer_norm_epsilon"), "layer_norm_epsilon", 1e-5, positive=True
        ),
        "mamba1": mamba1_reader(MAMBA_KEYS),
    },
    weight_renames=(
        (r"\.mamba\.", ".mixer."),
        (r"\.input_layernorm\.", ".norm."),
        (r"^model\.embed_tokens\.", "model.embeddings."),
        (r"^model\.norm\.", "model.norm_f."),
        (r"^model\.", "backbone."),
    ),
)

FALCON_MAMBA = dataclasses.replace(
    MAMBA,
    model_type="falcon_mamba",
    config_overrides={**MAMBA.config_overrides, "mamba1": mamba1_reader(FALCON_MAMBA_KEYS)},
)


def _period_layers(raw: Mapping[str, Any], what: str, period: int, offset: int) -> tuple[int, ...]:
    """The layers i with i % `what`_layer_period == `what`_layer_offset (JambaConfig's rule)."""
    period_key, offset_key = f"{what}_layer_period", f"{what}_layer_offset"
    period = fields.integer(raw.get(period_key), period_key, period)
    offset = fields.integer(raw.get(offset_key), offset_key, offset, positive=False)
    if offset >= period:
        raise ConfigError(
            f"config.json: {offset_key} {offset} is not below {period_key} {period}; accepted: "
            f"0..{period - 1}"
        )
    return tuple(i for i in range(fields.require(raw, "num_hidden_layers")) if i % period == offset)


def jamba_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """JambaConfig's layers_block_type: attention every attn_layer_period layers from
    attn_layer_offset (defaults 8 and 4), Mamba1 mixers elsewhere."""
    attention = _period_layers(raw, "attn", 8, 4)
    return tuple(
        "full_attention" if i in attention else "mamba"
        for i in range(fields.require(raw, "num_hidden_layers"))
    )


def jamba_moe(raw: Mapping[str, Any]) -> MoeConfig | None:
    """The experts of every expert_layer_period-th layer from expert_layer_offset (defaults 2
    and 1), routed by the top-k of a softmax, not renormalized; None with one expert (JambaMLP
    in every layer)."""
    if fields.integer(raw.get("num_experts"), "num_experts", 16) <= 1:
        return None
    moe = read_moe({"num_experts": 16, **raw}, MoeKeys(num_experts="num_experts", normalize=False))
    return dataclasses.replace(moe, sparse_layers=_period_layers(raw, "expert", 2, 1))


JAMBA = FamilyAdapter(
    model_type="jamba",
    config_aliases={"num_local_experts": "num_experts"},
    config_defaults={"num_key_value_heads": when_absent("num_key_value_heads", 8)},
    config_overrides={
        **UNBIASED_ATTENTION,
        "layer_types": jamba_layer_types,
        "no_rope_layers": lambda raw: tuple(range(fields.require(raw, "num_hidden_layers"))),
        "mamba1": mamba1_reader(JAMBA_KEYS),
        "moe": jamba_moe,
    },
    weight_renames=(
        (r"\.mlp\.gate\.", ".mlp.router."),
        *FALCON_H1.weight_renames,
    ),
    experts=ExpertLayout(),
)

MAMBA1_FAMILIES = (MAMBA, FALCON_MAMBA, JAMBA)
