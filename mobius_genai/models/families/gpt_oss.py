"""gpt_oss's row of the family table and the config reads that are its own.

What gpt_oss changes over the generic MoE decoder (transformers' GptOss* classes):

- attention sinks in every layer (`self_attn.sinks`, components/sinks.py); layers alternate
  sliding-window and full attention (`layer_types`, sliding first by default); q/k/v/o biases;
- a router with a bias whose top-k logits get a softmax over the k (the renormalized top-k of
  the full softmax, as the MoE op computes it);
- experts stored fused: `gate_up_proj` [E, hidden, 2I] with gate and up columns interleaved
  (gate at 2j, up at 2j + 1) and `down_proj` [E, I, hidden], both with biases; the SwiGLU is
  clamped, (clip(up, -limit, limit) + 1) * G * sigmoid(swiglu_alpha * G), G = min(gate, limit):
  the MoE op's activation with beta 1;
- yarn rope without truncation of its correction range (config/rope.py reads `truncate`).

Real checkpoints store the experts in MXFP4 (prequantized/mxfp4.py); the rest is bf16.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.config import fields
from mobius_genai.config.moe import ExpertActivation, MoeConfig, MoeKeys, read_moe
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.layers import alternating_layer_types
from mobius_genai.models.families.readers import when_absent

# GptOssConfig's defaults for what hub config.json files may leave out
_ALPHA, _LIMIT, _THETA = 1.702, 7.0, 150000.0
_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def _default_yarn(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """GptOssConfig's yarn rope when config.json gives neither rope_parameters nor rope_scaling."""
    return None if raw.get("rope_parameters") else dict(_YARN)


def gpt_oss_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """The routing and experts of a gpt_oss config.json: biased router and experts, clamped
    SwiGLU with `swiglu_alpha` and `swiglu_limit`."""
    moe = read_moe(raw, MoeKeys(num_experts="num_local_experts", normalize=True))
    activation = ExpertActivation(
        alpha=fields.number(raw.get("swiglu_alpha"), "swiglu_alpha", _ALPHA),
        beta=1.0,
        limit=fields.number(raw.get("swiglu_limit"), "swiglu_limit", _LIMIT, positive=True),
    )
    return dataclasses.replace(moe, router_bias=True, expert_bias=True, activation=activation)


GPT_OSS = FamilyAdapter(
    model_type="gpt_oss",
    genai_type="gptoss",
    config_aliases={"num_experts": "num_local_experts"},
    config_defaults={
        "attention_bias": True,
        "head_dim": when_absent("head_dim", 64),
        "num_key_value_heads": when_absent("num_key_value_heads", 8),
        "rms_norm_eps": 1e-5,
        "sliding_window": 128,
        "rope_theta": _THETA,
        "rope_scaling": _default_yarn,
        "layer_types": alternating_layer_types(2),
    },
    config_overrides={"attention_sinks": True, "moe": gpt_oss_moe},
    weight_renames=((r"\.mlp\.gate\.", ".mlp.router."),),
    experts=ExpertLayout(
        gate="gate_up_proj", up=None, down="down_proj", interleaved=True, in_out=True
    ),
)
