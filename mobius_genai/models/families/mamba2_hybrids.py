"""Nemotron-H and Falcon-H1: two more ways of placing Mamba2 mixers (components/mamba2.py)
among attention layers, as rows of the family table (hybrid_rows.py) and what they read.

- **Nemotron-H** (`nemotron_h`): each layer is one block with its norm and residual
  (`one_block_layers`): a Mamba2 mixer, attention without rotary, a relu2 MLP of up_proj
  and down_proj alone, or (Nemotron-3) a MoE block: DeepSeek-V3's grouped sigmoid routing
  with the correction bias, non-gated relu2 experts and one relu2 shared expert of
  `moe_shared_expert_intermediate_size` (transformers' NemotronHMoE), the routed experts in
  a latent of `moe_latent_size` between two projections in Nemotron-3 Super. The hub's
  config.json spells the layers as `hybrid_override_pattern` ("M" Mamba2, "*" attention, "-"
  MLP, "E" MoE); transformers 5 writes `layers_block_type` ("linear_attention", "full_attention",
  "mlp", "moe") and no num_hidden_layers. Tensors stay under the hub's `backbone.` with every
  block named `mixer`, the experts one tensor each (`experts.{e}.up_proj.weight`).
- **Falcon-H1** (`falcon_h1`): every layer runs attention and a Mamba2 mixer side by side on
  the same normed input and adds them (`parallel_recurrent`), then a gated MLP. Its µP
  multipliers: on the embeddings and the logits (the config's `embedding_multiplier` and
  `logits_scaling`), and on the attention's input, keys and output, the Mamba2 mixer's input,
  its in_proj rows (`mup_vector`: one factor each for gate, x, B, C and dt) and output, the
  MLP's gate and down projections, folded into those weights as they are read
  (config/weight_scales.py).
- **Bamba** (`bamba`): Granite-4.0-H's Mamba2 keys (config/mamba2.py's GRANITE_KEYS) in the
  layers not in `attn_layer_indices`, llama attention with rotary on half of each head
  (BambaConfig fixes partial_rotary_factor at 0.5 whatever config.json says) in the others,
  each layer then a gated MLP (`feed_forward`), norms named as Falcon-H1's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.mamba2 import (
    FALCON_H1_KEYS,
    GRANITE_KEYS,
    NEMOTRON_H_KEYS,
    Mamba2Config,
    mamba2_reader,
    read_mamba2,
)
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.rope import RopeConfig, parse_rope
from mobius_genai.config.weight_scales import WeightScale, scale
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.deepseek import v3_routing
from mobius_genai.models.families.family_keys import READS_MLP_BIAS
from mobius_genai.models.families.float32 import CORRECTED_ROUTER
from mobius_genai.models.families.preprocess import scaled_weights
from mobius_genai.models.families.readers import positive_number, when_absent

#: Nemotron-H's layer kinds as the hub's pattern and transformers 5 spell them → this
#: package's (a MoE layer is an "mlp" layer whose MLP is the MoE block: `_NEMOTRON_H_MOE`).
_NEMOTRON_H_KINDS = {
    "M": "mamba2",
    "linear_attention": "mamba2",
    "mamba": "mamba2",
    "*": "full_attention",
    "full_attention": "full_attention",
    "attention": "full_attention",
    "-": "mlp",
    "mlp": "mlp",
    "E": "mlp",
    "moe": "mlp",
}
_NEMOTRON_H_MOE = frozenset({"E", "moe"})


def _nemotron_h_blocks(raw: Mapping[str, Any]) -> list[str]:
    """NemotronHConfig's layers as spelled: `layers_block_type` (`layer_types`) when given,
    else the hub's `hybrid_override_pattern`; their count is the model's layer count."""
    kinds = raw.get("layers_block_type") or raw.get("layer_types")
    key = "layers_block_type"
    if not kinds:
        key, kinds = "hybrid_override_pattern", raw.get("hybrid_override_pattern")
        kinds = list(kinds) if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds or any(k not in _NEMOTRON_H_KINDS for k in kinds):
        raise ConfigError(
            f"config.json: {key} is {raw.get(key)!r}; accepted: layers_block_type, a list of "
            f"{[k for k in _NEMOTRON_H_KINDS if len(k) > 1]}, or hybrid_override_pattern, a "
            "string of M, *, - and E"
        )
    return kinds


def nemotron_h_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The layers as this package's kinds (a MoE layer is an "mlp" layer)."""
    return tuple(_NEMOTRON_H_KINDS[kind] for kind in _nemotron_h_blocks(raw))


def _nemotron_h_layer_count(raw: Mapping[str, Any]) -> int:
    return len(_nemotron_h_blocks(raw))


#: NemotronHMoE's sizes: the experts' and the shared expert's widths under their own keys.
_NEMOTRON_H_MOE_KEYS = MoeKeys(
    num_experts="n_routed_experts",
    intermediate="moe_intermediate_size",
    normalize_default=True,
    shared_expert="moe_shared_expert_intermediate_size",
)


def nemotron_h_moe(raw: Mapping[str, Any]) -> MoeConfig | None:
    """The MoE block of the "E" layers (None without them): DeepSeek-V3's routing, experts
    and shared expert of `mlp_hidden_act` (relu2, not gated); with `moe_latent_size`
    (Nemotron-3 Super's), the routed experts between fc1_latent_proj and fc2_latent_proj."""
    kinds = _nemotron_h_blocks(raw)
    sparse = tuple(i for i, kind in enumerate(kinds) if kind in _NEMOTRON_H_MOE)
    if not sparse:
        return None
    moe = read_moe({**raw, "num_hidden_layers": len(kinds)}, _NEMOTRON_H_MOE_KEYS)
    return dataclasses.replace(
        moe,
        sparse_layers=sparse,
        group_routing=v3_routing(raw),
        experts=raw.get("mlp_hidden_act") or "relu2",
        latent_size=fields.integer(raw.get("moe_latent_size"), "moe_latent_size", 0),
    )


NEMOTRON_H = FamilyAdapter(
    model_type="nemotron_h",
    family_keys=READS_MLP_BIAS,
    float32=CORRECTED_ROUTER,
    config_aliases={"attention_head_dim": "head_dim", "num_local_experts": "n_routed_experts"},
    config_defaults={
        "head_dim": 128,
        "num_key_value_heads": when_absent("num_key_value_heads", 8),
        "num_hidden_layers": _nemotron_h_layer_count,
        # NemotronHConfig's defaults: the MLP layers' width, and the MoE layers'
        "intermediate_size": 21504,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 7688,
        "moe_shared_expert_intermediate_size": 7688,
        "routed_scaling_factor": 1.0,
        "n_group": 1,
        "topk_group": 1,
    },
    config_overrides={
        "layer_types": nemotron_h_layer_types,
        "num_hidden_layers": _nemotron_h_layer_count,
        "one_block_layers": True,
        "no_rope_layers": lambda raw: tuple(range(_nemotron_h_layer_count(raw))),
        "gated_mlp": False,
        "hidden_act": lambda raw: raw.get("mlp_hidden_act") or "relu2",
        # NemotronHAttention's projections have no bias whatever attention_bias says, and
        # NemotronHForCausalLM ties no LM head whatever tie_word_embeddings says
        "qkv_bias": False,
        "o_bias": False,
        "tie_word_embeddings": False,
        "norm_eps": lambda raw: fields.number(
            raw.get("layer_norm_epsilon"), "layer_norm_epsilon", 1e-5, positive=True
        ),
        "mamba2": mamba2_reader(NEMOTRON_H_KEYS),
        "moe": nemotron_h_moe,
    },
    weight_renames=(
        (r"\.mlp\.fc1\.", ".mlp.up_proj."),
        (r"\.mlp\.fc2\.", ".mlp.down_proj."),
        (r"\.shared_expert\.fc1\.", ".shared_experts.up_proj."),
        (r"\.shared_expert\.fc2\.", ".shared_experts.down_proj."),
        (r"\.(self_attn|mamba|mlp)\.", ".mixer."),
        (r"\.input_layernorm\.", ".norm."),
        (r"^model\.embed_tokens\.", "model.embeddings."),
        (r"^model\.norm\.", "model.norm_f."),
        (r"^model\.", "backbone."),
    ),
    # non-gated experts: the up projection in both rows of each of the MoE node's pairs
    experts=ExpertLayout(gate="{e}.up_proj.weight", up="{e}.up_proj.weight"),
    # the multi-token-prediction head (NemotronHPreTrainedModel's
    # _keys_to_ignore_on_load_unexpected): a decoder bundle does not run it
    unused_weights=(r"^mtp\.",),
)


def falcon_h1_mamba2(raw: Mapping[str, Any]) -> Mamba2Config:
    """FalconH1Config's Mamba2 sizes and its gated norm: none unless `mamba_rms_norm` (the
    default false: y * silu(gate)), normalizing before gating with `mamba_norm_before_gate`
    (default true)."""
    config = read_mamba2(raw, FALCON_H1_KEYS)
    if not fields.flag(raw.get("mamba_rms_norm"), "mamba_rms_norm", False):
        norm = "gate"
    elif fields.flag(raw.get("mamba_norm_before_gate"), "mamba_norm_before_gate", True):
        norm = "norm_then_gate"
    else:
        norm = "gate_then_norm"
    return Mamba2Config(**{**config.__dict__, "norm": norm})


def _multipliers(raw: Mapping[str, Any], key: str, count: int) -> list[float]:
    values = raw.get(key)
    if values is None:
        return [1.0] * count
    if not isinstance(values, list | tuple) or len(values) != count:
        raise ConfigError(f"config.json: {key} is {values!r}; accepted: a list of {count} numbers")
    return [fields.number(value, key) for value in values]


def falcon_h1_weight_scales(raw: Mapping[str, Any]) -> tuple[WeightScale, ...]:
    """FalconH1's multipliers inside each layer as scales of the weights they multiply."""
    number = {
        key: positive_number(key)(raw)
        for key in (
            "attention_in_multiplier",
            "key_multiplier",
            "attention_out_multiplier",
            "ssm_in_multiplier",
            "ssm_out_multiplier",
        )
    }
    gate_m, down_m = _multipliers(raw, "mlp_multipliers", 2)
    z, x, b, c, dt = _multipliers(raw, "ssm_multipliers", 5)
    sizes = falcon_h1_mamba2(raw)
    groups = sizes.groups * sizes.state_size
    rows = ((sizes.intermediate, z), (sizes.intermediate, x), (groups, b), (groups, c), (None, dt))
    ssm_in = number["ssm_in_multiplier"]
    attention_in, key = number["attention_in_multiplier"], number["key_multiplier"]
    return (
        scale(r"\.self_attn\.[qv]_proj\.weight$", attention_in),
        scale(r"\.self_attn\.k_proj\.weight$", attention_in * key),
        scale(r"\.self_attn\.k_proj\.bias$", key),
        scale(r"\.self_attn\.o_proj\.", number["attention_out_multiplier"]),
        WeightScale(r"\.mamba\.in_proj\.weight$", tuple((n, f * ssm_in) for n, f in rows)),
        WeightScale(r"\.mamba\.in_proj\.bias$", rows),
        scale(r"\.mamba\.out_proj\.", number["ssm_out_multiplier"]),
        scale(r"\.mlp\.gate_proj\.", gate_m),
        scale(r"\.mlp\.down_proj\.", down_m),
    )


#: FalconH1Config's and BambaConfig's key/value heads and RMSNorm epsilon.
_KV_HEADS_AND_EPS = {
    "num_key_value_heads": when_absent("num_key_value_heads", 8),
    "rms_norm_eps": 1e-5,
}

FALCON_H1 = FamilyAdapter(
    model_type="falcon_h1",
    family_keys=READS_MLP_BIAS,
    config_defaults={
        **_KV_HEADS_AND_EPS,
        # the Mamba2 width; an explicit null: mamba_expand x hidden_size
        "mamba_d_ssm": when_absent("mamba_d_ssm", 1024),
    },
    config_overrides={
        "layer_types": lambda raw: ("full_attention",) * fields.require(raw, "num_hidden_layers"),
        "parallel_recurrent": "mamba2",
        "mamba2": falcon_h1_mamba2,
        "embedding_multiplier": positive_number("embedding_multiplier"),
        "logits_scaling": lambda raw: 1.0 / positive_number("lm_head_multiplier")(raw),
        "weight_scales": falcon_h1_weight_scales,
    },
    weight_renames=(
        (r"\.mlp\.", ".feed_forward."),
        (r"\.post_attention_layernorm\.", ".pre_ff_layernorm."),
        (r"^model\.norm\.", "model.final_layernorm."),
    ),
    preprocess_weight=scaled_weights,
    preprocessed_weights=r"\.(self_attn\.[qkvo]_proj|mamba\.(in|out)_proj|mlp\.(gate|down)_proj)\.",
)


def _bamba_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """BambaConfig's layers_block_type: attention in `attn_layer_indices`, Mamba2 elsewhere."""
    attention = fields.int_tuple(raw.get("attn_layer_indices"), "attn_layer_indices")
    return tuple(
        "full_attention" if i in attention else "mamba2"
        for i in range(fields.require(raw, "num_hidden_layers"))
    )


def _bamba_rope(raw: Mapping[str, Any]) -> RopeConfig:
    """BambaConfig passes partial_rotary_factor 0.5 to its rope parameters, always."""
    rope, _ = parse_rope(raw)
    return dataclasses.replace(rope, partial_rotary_factor=0.5)


BAMBA = FamilyAdapter(
    model_type="bamba",
    family_keys=READS_MLP_BIAS,
    config_defaults=_KV_HEADS_AND_EPS,
    config_overrides={
        "layer_types": _bamba_layer_types,
        "rope": _bamba_rope,
        "mamba2": mamba2_reader(GRANITE_KEYS),
    },
    weight_renames=FALCON_H1.weight_renames,
)
