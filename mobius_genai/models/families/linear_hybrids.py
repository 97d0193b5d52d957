"""Config reads of the hybrids whose recurrent layers are delta-rule blocks besides Qwen3.5's
(hybrid.py): OLMo hybrid's delta nets between olmo3 attention layers, Lara-Mini's between
windowed rotary and global NoPE attention layers, with MoE blocks, and Kimi Linear's delta
attention between NoPE latent-attention layers, with DeepSeek-V3's MoE blocks."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.latent_attention import read_latent_attention
from mobius_genai.config.linear_attention import LinearAttentionConfig, read_linear_attention
from mobius_genai.config.moe import MoeConfig
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models.families.deepseek import sparse_mlp_layers, v3_moe

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


def _silu_convs(raw: Mapping[str, Any], model_type: str) -> None:
    """The delta nets' convs activate with `hidden_act`: only SiLU, the conv kernel's."""
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(
            f"config.json: hidden_act is {act!r}; {model_type} models are supported with "
            "'silu', the activation of the delta nets' convolution"
        )


def olmo_hybrid_linear_attention(raw: Mapping[str, Any]) -> LinearAttentionConfig:
    """OlmoHybridGatedDeltaNet: q_proj, k_proj, v_proj apart, beta doubled unless
    `linear_allow_neg_eigval` is false, the gated norm at FLA's epsilon; its conv's activation
    is `hidden_act`, which must be SiLU (the conv kernel's)."""
    _silu_convs(raw, "olmo_hybrid")
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


#: KimiLinearConfig's delta-attention keys → the hub's `linear_attn_config` keys and defaults.
_KIMI_LINEAR_KEYS = {
    "linear_num_heads": ("num_heads", 32),
    "linear_head_dim": ("head_dim", 128),
    "linear_conv_kernel_dim": ("short_conv_kernel_size", 4),
}


def _kimi_hub_section(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    section = raw.get("linear_attn_config") or {}
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"config.json: linear_attn_config is {section!r}; accepted: an object of the delta "
            "attention's settings"
        )
    return section


def _kimi_size(raw: Mapping[str, Any], key: str) -> int:
    hub_key, default = _KIMI_LINEAR_KEYS[key]
    value = raw.get(key)
    if value is None:
        value = _kimi_hub_section(raw).get(hub_key, default)
    return fields.integer(value, key, default)


def kimi_linear_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """KimiLinearConfig without `layer_types`: the hub's `linear_attn_config` lists the
    1-indexed `full_attn_layers` and `kda_layers`; without them every 4th layer from the 5th
    (index 4, 8, ...) attends."""
    num_layers = fields.require(raw, "num_hidden_layers")
    section = _kimi_hub_section(raw)
    if "full_attn_layers" in section and "kda_layers" in section:
        kinds: list[Any] = [None] * num_layers
        for key, kind in (
            ("full_attn_layers", "full_attention"),
            ("kda_layers", "linear_attention"),
        ):
            for layer in section[key]:
                if not fields.is_int(layer) or not 1 <= layer <= num_layers:
                    raise ConfigError(
                        f"config.json: linear_attn_config.{key} holds {layer!r}; accepted: "
                        f"1-indexed layers 1..{num_layers}"
                    )
                kinds[layer - 1] = kind
        return kinds
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(num_layers)]


def kimi_linear_attention(raw: Mapping[str, Any]) -> LinearAttentionConfig:
    """KimiLinearDeltaAttention: `linear_num_heads` query, key and value heads of
    `linear_head_dim`, q, k and v convolved apart, a decay per key channel."""
    _silu_convs(raw, "kimi_linear")
    heads = _kimi_size(raw, "linear_num_heads")
    head_dim = _kimi_size(raw, "linear_head_dim")
    return LinearAttentionConfig(
        key_heads=heads,
        value_heads=heads,
        key_head_dim=head_dim,
        value_head_dim=head_dim,
        conv_kernel_size=_kimi_size(raw, "linear_conv_kernel_dim"),
        separate_qkv=True,
        rule="kimi",
    )


def kimi_linear_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """DeepSeek-V3's routing in the layers `mlp_layer_types` calls "sparse" (by default all
    but the first `first_k_dense_replace`, 1 when absent), dense MLPs in the others."""
    first = fields.integer(
        raw.get("first_k_dense_replace"), "first_k_dense_replace", 1, positive=False
    )
    return dataclasses.replace(v3_moe(raw), sparse_layers=sparse_mlp_layers(raw, first))


def _every_layer(raw: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(range(fields.require(raw, "num_hidden_layers")))


#: Kimi Linear's latent attention: DeepSeek's, NoPE in every layer (its rope slices attend
#: unrotated), scaled by qk_head_dim ** -0.5, a latent cache of one head.
KIMI_LINEAR_ATTENTION = {
    "latent_attention": read_latent_attention,
    "head_dim": lambda raw: read_latent_attention(raw).cache_head_dim,
    "num_key_value_heads": 1,
    "attention_scale": lambda raw: read_latent_attention(raw).qk_head_dim ** -0.5,
    "no_rope_layers": _every_layer,
}
