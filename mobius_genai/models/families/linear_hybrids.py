"""Config reads of the hybrids whose recurrent layers are gated delta nets besides Qwen3.5's
(hybrid.py): OLMo hybrid's delta nets between olmo3 attention layers, Lara-Mini's between
windowed rotary and global NoPE attention layers, with MoE blocks."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.linear_attention import LinearAttentionConfig, read_linear_attention
from mobius_genai.errors import UnsupportedModelError

#: FLA's FusedRMSNormGated epsilon, which OLMo hybrid's gated norm keeps whatever rms_norm_eps.
_OLMO_GATED_NORM_EPS = 1e-5


def olmo_hybrid_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """OlmoHybridConfig without `layer_types`: every 4th layer attends (the 4th, 8th, ...), the
    others are delta nets; with fewer than 4 layers the last one attends."""
    num_layers = fields.require(raw, "num_hidden_layers")
    kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(num_layers)]
    if "full_attention" not in kinds:
        kinds[-1] = "full_attention"
    return kinds


def _heads(raw: Mapping[str, Any]) -> int:
    return fields.require(raw, "num_attention_heads")


#: OlmoHybridConfig's delta-net sizes where config.json leaves them out: as many key and value
#: heads as attention heads, key heads of 0.75 * hidden_size / key heads, value heads twice that.
OLMO_HYBRID_LINEAR_DEFAULTS = {
    "linear_num_key_heads": _heads,
    "linear_num_value_heads": _heads,
    "linear_key_head_dim": lambda raw: int(
        0.75 * fields.require(raw, "hidden_size") / fields.require(raw, "linear_num_key_heads")
    ),
    "linear_value_head_dim": lambda raw: 2 * fields.require(raw, "linear_key_head_dim"),
}


def olmo_hybrid_linear_attention(raw: Mapping[str, Any]) -> LinearAttentionConfig:
    """OlmoHybridGatedDeltaNet: q_proj, k_proj, v_proj apart, beta doubled unless
    `linear_allow_neg_eigval` is false, the gated norm at FLA's epsilon; its conv's activation
    is `hidden_act`, which must be SiLU (the conv kernel's)."""
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(
            f"config.json: hidden_act is {act!r}; olmo_hybrid models are supported with 'silu', "
            "the activation of the delta nets' convolution"
        )
    negative = fields.flag(raw.get("linear_allow_neg_eigval"), "linear_allow_neg_eigval", True)
    return dataclasses.replace(
        read_linear_attention(raw),
        separate_qkv=True,
        beta_scale=2.0 if negative else 1.0,
        gated_norm_eps=_OLMO_GATED_NORM_EPS,
    )


def olmo_hybrid_no_rope(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """Every layer when `rope_parameters` gives no rope_theta (the released checkpoints' NoPE:
    OlmoHybridModel then builds no rotary embedding), else none."""
    rope = raw.get("rope_parameters")
    if isinstance(rope, Mapping) and rope.get("rope_theta") is None:
        return tuple(range(fields.require(raw, "num_hidden_layers")))
    return ()


#: LaraMiniConfig's repeating layer pattern when config.json has no `layer_types`.
_LARA_MINI_PATTERN = (
    "linear_attention",
    "sliding_attention",
    "linear_attention",
    "full_attention",
    "sliding_attention",
)


def lara_mini_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """LaraMiniConfig without `layer_types`: delta net, windowed, delta net, global, windowed,
    repeated over the layers."""
    num_layers = fields.require(raw, "num_hidden_layers")
    return [_LARA_MINI_PATTERN[i % len(_LARA_MINI_PATTERN)] for i in range(num_layers)]


def lara_mini_no_rope(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """The global ("full_attention") layers: LaraMiniModel rotates only in windowed ones."""
    kinds = raw.get("layer_types") or lara_mini_layer_types(raw)
    return tuple(i for i, kind in enumerate(kinds) if kind == "full_attention")
