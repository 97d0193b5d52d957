"""Llama 4's text decoder (`llama4_text`): chunked local attention in the layers that rotate,
NoPE global layers with attention temperature tuning (config/local_global.py), and MoE layers
whose top-k experts take each token times sigmoid(its router logit) beside an always-on shared
expert (config/moe.py `scaled_input`).

Keys the config class fills when absent are the row's defaults, as Llama4TextConfig sets them.
`no_rope_layers` holds one flag per layer, 1 where the layer rotates (smollm3's convention);
the hub's `llama4` checkpoints (Llama4ForConditionalGeneration) are built text-only;
layer types are written by transformers 5 and derived from those flags in hub configs. Dense
layers have `intermediate_size_mlp`, experts and the shared expert `intermediate_size`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.local_global import CHUNKED, LocalGlobalAttention, TemperatureTuning
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.text_config import TextOnly
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.layers import smollm3_no_rope_layers
from mobius_genai.models.families.readers import when_absent


def _no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """The NoPE layers; an empty `no_rope_layers` (as in hub configs) means the default, every
    `no_rope_layer_interval`-th layer, as Llama4TextConfig reads it."""
    if not raw.get("no_rope_layers"):
        raw = {**raw, "no_rope_layers": None}
    return smollm3_no_rope_layers(raw)


def _layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Chunked attention where a layer rotates and a chunk size is set; full elsewhere."""
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    nope = _no_rope_layers(raw)
    chunked = raw.get("attention_chunk_size") is not None
    return tuple(
        CHUNKED if chunked and i not in nope else "full_attention"
        for i in range(fields.require(raw, "num_hidden_layers"))
    )


def _tuning_on(raw: Mapping[str, Any]) -> bool:
    """attn_temperature_tuning: a bool, or a number hub configs give it (Scout's 4) read as
    Llama4TextAttention reads it, by its truth."""
    value = raw.get("attn_temperature_tuning", True)
    if not isinstance(value, bool | int):
        raise ConfigError(
            f"config.json: field 'attn_temperature_tuning' must be true/false, found {value!r}"
        )
    return bool(value)


def _local_global(raw: Mapping[str, Any]) -> LocalGlobalAttention:
    tuning = None
    if _tuning_on(raw):
        tuning = TemperatureTuning(
            floor_scale=fields.number(raw.get("floor_scale"), "floor_scale", 8192.0, positive=True),
            scale=fields.number(raw.get("attn_scale"), "attn_scale", 0.1, positive=True),
        )
    return LocalGlobalAttention(
        chunk_size=fields.integer(raw.get("attention_chunk_size"), "attention_chunk_size"),
        qk_l2_norm=fields.flag(raw.get("use_qk_norm"), "use_qk_norm", True),
        temperature=tuning,
    )


def _moe_layers(raw: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """`moe_layers`, else every `interleave_moe_layer_step`-th layer (Llama4TextConfig's rule)."""
    if raw.get("moe_layers") is None:
        step = fields.integer(raw.get("interleave_moe_layer_step"), "interleave_moe_layer_step", 1)
        return tuple(range(step - 1, num_layers, step))
    layers = fields.int_tuple(raw.get("moe_layers"), "moe_layers")
    outside = [i for i in layers if not 0 <= i < num_layers]
    if outside:
        raise ConfigError(
            f"config.json: field 'moe_layers' holds {outside}; accepted: layer indices "
            f"0..{num_layers - 1}"
        )
    return tuple(sorted(set(layers)))


def _moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Experts and the shared expert of `intermediate_size`; scores scale the expert's input."""
    moe = read_moe(raw, MoeKeys(num_experts="num_local_experts", normalize=False))
    return dataclasses.replace(
        moe,
        sparse_layers=_moe_layers(raw, fields.require(raw, "num_hidden_layers")),
        shared_expert_size=moe.intermediate_size,
        scaled_input=True,
    )


LLAMA4_TEXT = FamilyAdapter(
    model_type="llama4_text",
    config_defaults={
        "head_dim": when_absent("head_dim", 128),
        "num_key_value_heads": when_absent("num_key_value_heads", 8),
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "num_local_experts": 16,
        "num_experts_per_tok": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500_000.0,  # Llama4TextConfig's default_theta
        "attention_chunk_size": when_absent("attention_chunk_size", 8192),
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    config_overrides={
        "intermediate_size": lambda raw: fields.require(raw, "intermediate_size_mlp"),
        "rope_interleaved": True,  # complex rotation of pairs (x0, x1), (x2, x3), ...
        "no_rope_layers": _no_rope_layers,
        "layer_types": _layer_types,
        "local_global": _local_global,
        "moe": _moe,
    },
    weight_renames=((r"\.mlp\.gate\.", ".feed_forward.router."), (r"\.mlp\.", ".feed_forward.")),
    # gate_up_proj [experts, hidden, 2 * inter] = [gate | up] columns, down_proj [E, inter, hidden]
    experts=ExpertLayout(gate="gate_up_proj", up=None, down="down_proj", in_out=True),
)

# Llama 4's hub checkpoints (Llama4ForConditionalGeneration: the decoder's keys in `text_config`,
# its weights under language_model.) built text-only, as qwen3_5's are.
LLAMA4 = dataclasses.replace(
    LLAMA4_TEXT,
    model_type="llama4",
    weight_renames=(
        *LLAMA4_TEXT.weight_renames,
        (r"^model\.", "language_model.model."),
        (r"^lm_head\.", "language_model.lm_head."),
    ),
    unused_weights=(r"^vision_model\.", r"^multi_modal_projector\."),
    text_only=TextOnly(
        not_built="the vision tower (vision_model.*, multi_modal_projector.*): a text-only bundle",
        # Llama4TextConfig's defaults for the keys llama4_text's row requires
        text_defaults={
            "vocab_size": 202_048,
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "max_position_embeddings": 131_072,
        },
        top_level_keys={"tie_word_embeddings": False},
    ),
)
