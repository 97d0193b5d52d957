"""Config reads and weight changes of hybrid families, whose layers mix attention with
recurrent blocks (LFM2's short convolutions, Qwen3.5's gated delta nets)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from mobius_genai.config import ArchitectureConfig, fields
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


def qwen3_5_layer_types(raw: Mapping[str, Any]) -> list[str]:
    """Qwen3_5TextConfig without `layer_types`: every `full_attention_interval`-th layer (4 when
    absent) attends, the others are gated delta nets."""
    num_layers = fields.require(raw, "num_hidden_layers")
    interval = fields.integer(raw.get("full_attention_interval"), "full_attention_interval", 4)
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(num_layers)
    ]


#: Qwen3.5's norms that scale by 1 + weight: all but the gated norm of the gated delta nets.
QWEN3_5_OFFSET_NORMS = r"(?<!linear_attn\.)norm\.weight$"


def qwen3_5_norm_weights(name: str, array: np.ndarray, config: ArchitectureConfig) -> np.ndarray:
    """Store 1 + weight as the scale of the norms that use it (Qwen3_5RMSNorm)."""
    if re.search(QWEN3_5_OFFSET_NORMS, name):
        return array.astype(np.float32) + 1.0
    return array
