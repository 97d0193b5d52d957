"""DBRX (databricks/dbrx-instruct): a MoE decoder whose config.json nests its attention and
expert settings in `attn_config` and `ffn_config` (transformers' DbrxConfig sub-configs).

Each layer is LayerNorm (no bias) → attention from one fused `Wqkv` projection clipped to
[-clip_qkv, clip_qkv] → LayerNorm (no bias) → experts. The router's softmax top-k
probabilities are divided by their p-norm, p = `moe_normalize_expert_weights` (1: their sum;
null: kept as they are); `moe_jitter_eps` only perturbs training. The experts are SwiGLU MLPs
stored flat: `w1` (gate), `v1` (up) and `w2` (down, [in, out] per expert), each [experts *
ffn_hidden_size, d_model] (checkpoint/experts.py's `flat` layout reads one expert's rows at a
time). Defaults are DbrxConfig's and its sub-configs'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.models.families.adapter import FamilyAdapter

_ATTN, _FFN = "attn_config", "ffn_config"
_NORMALIZE = "moe_normalize_expert_weights"


def _section(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    return fields.mapping(raw.get(name), name)


def _nested(name: str, key: str, default: Any) -> Callable[[Mapping[str, Any]], Any]:
    """A config default: `raw[name][key]`, or `default` where it is absent or null."""

    def read(raw: Mapping[str, Any]) -> Any:
        value = _section(raw, name).get(key)
        return default if value is None else value

    return read


def _activation(raw: Mapping[str, Any]) -> Any:
    """DbrxExpertGLU's activation: ffn_act_fn's "name" (silu by default)."""
    act = fields.mapping(_section(raw, _FFN).get("ffn_act_fn"), f"{_FFN}.ffn_act_fn")
    return act.get("name", "silu")


def _rope_theta(raw: Mapping[str, Any]) -> float:
    """Hub checkpoints (transformers 4) give the base only as attn_config.rope_theta, which
    databricks' code and transformers 4 rotate by; checkpoints transformers 5 writes carry it
    in rope_parameters, read before this default."""
    theta = _section(raw, _ATTN).get("rope_theta")
    return fields.number(theta, f"{_ATTN}.rope_theta", 10_000.0, positive=True)


def _clip_qkv(raw: Mapping[str, Any]) -> float | None:
    clip = _section(raw, _ATTN).get("clip_qkv")
    return fields.number(clip, f"{_ATTN}.clip_qkv", None, positive=True)


def dbrx_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Experts in every layer; the top-k renormalized by their p-norm unless p is null."""
    ffn = _section(raw, _FFN)
    p = fields.number(ffn.get(_NORMALIZE, 1.0), f"{_FFN}.{_NORMALIZE}", positive=True)
    moe = read_moe(raw, MoeKeys(num_experts="num_experts", normalize=p is not None))
    return moe if p is None else dataclasses.replace(moe, norm_p=p)


DBRX = FamilyAdapter(
    model_type="dbrx",
    config_aliases={
        "d_model": "hidden_size",
        "n_heads": "num_attention_heads",
        "n_layers": "num_hidden_layers",
        "max_seq_len": "max_position_embeddings",
    },
    config_defaults={
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "max_position_embeddings": 2048,
        "vocab_size": 32_000,
        "num_key_value_heads": _nested(_ATTN, "kv_n_heads", 1),
        "rope_theta": _rope_theta,
        "intermediate_size": _nested(_FFN, "ffn_hidden_size", 3584),
        "num_experts": _nested(_FFN, "moe_num_experts", 4),
        "num_experts_per_tok": _nested(_FFN, "moe_top_k", 1),
        "hidden_act": _activation,
        "layer_norm_eps": 1e-5,  # nn.LayerNorm's
    },
    config_overrides={
        "norm_type": "layer_no_bias",
        "packed_qkv": True,
        "qkv_bias": False,
        "o_bias": False,
        "clip_qkv": _clip_qkv,
        "moe": dbrx_moe,
    },
    weight_renames=(
        (r"\.self_attn\.qkv_proj\.", ".norm_attn_norm.attn.Wqkv."),
        (r"\.self_attn\.o_proj\.", ".norm_attn_norm.attn.out_proj."),
        (r"\.input_layernorm\.", ".norm_attn_norm.norm_1."),
        (r"\.post_attention_layernorm\.", ".norm_attn_norm.norm_2."),
        (r"\.mlp\.gate\.", ".ffn.router.layer."),
        (r"\.mlp\.experts$", ".ffn.experts"),
        (r"^model\.layers\.", "transformer.blocks."),
        (r"^model\.embed_tokens\.", "transformer.wte."),
        (r"^model\.norm\.", "transformer.norm_f."),
    ),
    experts=ExpertLayout(gate="mlp.w1", up="mlp.v1", down="mlp.w2", flat=True),
)
