"""The component of a "linear_attention" layer (config/recurrent.py's row names this module's
`delta_rule_block`): the delta-rule block its settings' `rule` says."""

from __future__ import annotations

from onnxscript import nn

from mobius_genai.components.gated_delta_net import GatedDeltaNet
from mobius_genai.components.kimi_delta import KimiDeltaAttention
from mobius_genai.config import ArchitectureConfig

#: LinearAttentionConfig.rule → its block: Qwen3.5's gated delta net (a decay per head),
#: Kimi's delta attention (a decay per key channel).
_BLOCKS = {"gated_delta": GatedDeltaNet, "kimi": KimiDeltaAttention}


def delta_rule_block(config: ArchitectureConfig) -> nn.Module:
    """The block of a "linear_attention" layer of `config`."""
    return _BLOCKS[config.linear_attention.rule](config)
