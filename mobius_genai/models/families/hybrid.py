"""Config reads of hybrid families, whose layers mix attention with recurrent blocks (LFM2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


def lfm2_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Lfm2Config without `layer_types`: attention at `full_attn_idxs` (all layers when absent),
    short convolutions elsewhere."""
    num_layers = fields.require(raw, "num_hidden_layers")
    indices = raw.get("full_attn_idxs")
    if indices is None:
        indices = range(num_layers)
    elif not isinstance(indices, list) or not all(fields.is_int(i) for i in indices):
        raise ConfigError(
            f"config.json: field 'full_attn_idxs' must be a list of layer indices, found "
            f"{indices!r}"
        )
    return ["full_attention" if i in indices else "conv" for i in range(num_layers)]


def lfm2_intermediate_size(raw: Mapping[str, Any]) -> int:
    """Lfm2MLP's width: with `block_auto_adjust_ff_dim` (default true) 2/3 of
    `intermediate_size`, times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`."""
    size = fields.require(raw, "intermediate_size")
    if not fields.flag(raw.get("block_auto_adjust_ff_dim"), "block_auto_adjust_ff_dim", True):
        return size
    size = int(2 * size / 3)
    multiplier = fields.number(raw.get("block_ffn_dim_multiplier"), "block_ffn_dim_multiplier")
    if multiplier is None:
        return size
    multiple = fields.integer(raw.get("block_multiple_of"), "block_multiple_of", 256)
    size = int(multiplier * size)
    return multiple * ((size + multiple - 1) // multiple)


def lfm2_conv_kernel_size(raw: Mapping[str, Any]) -> int:
    """Taps of the short convolution (`conv_L_cache`, 3 when absent)."""
    return fields.integer(raw.get("conv_L_cache"), "conv_L_cache", 3)
