"""BitNet b1.58's BitLinear projections (transformers' modeling_bitnet.py and
integrations/bitnet.py): an RMSNorm before o_proj (`attn_sub_norm`) and before down_proj
(`ffn_sub_norm`), and with a bitnet `quantization_config` every projection of the layers
reads its input quantized to int8 per token (absmax) and dequantized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.bitnet_config import bitnet_quantization
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BitLinearConfig:
    """The projections of a BitNet layer."""

    int8_activations: bool
    """Whether each projection's input goes through int8 per-token quantize-dequantize."""


def bitlinear_config(raw: Mapping[str, Any]) -> BitLinearConfig:
    """The BitLinear settings of a bitnet config.json: int8 activations where its
    quantization_config is bitnet's (without one transformers runs float projections)."""
    quantized = bitnet_quantization(raw) is not None
    if quantized and raw.get("attention_bias"):
        raise ConfigError(
            "config.json: attention_bias is true with a bitnet quantization_config; accepted: "
            "BitNet's projections without biases"
        )
    return BitLinearConfig(int8_activations=quantized)
