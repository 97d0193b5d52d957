"""One pre-norm decoder layer: x + attn(norm(x)), then h + mlp(norm(h))."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.attention import Attention
from mobius_genai.components.mlp import GatedMLP
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.rope import RotaryEmbedding
from mobius_genai.config import ArchitectureConfig


class DecoderLayer(nn.Module):
    """Pre-norm residual block; module names follow the llama checkpoint layout."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = GatedMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act, config.mlp_bias
        )

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        position_ids: ir.Value,
        rotary: RotaryEmbedding | None,
        attention_bias: ir.Value,
        past_key: ir.Value,
        past_value: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        residual = hidden_states
        attn_out, present_key, present_value = self.self_attn(
            op,
            self.input_layernorm(op, hidden_states),
            position_ids,
            rotary,
            attention_bias,
            past_key,
            past_value,
        )
        hidden_states = op.Add(residual, attn_out)
        residual = hidden_states
        hidden_states = self.mlp(op, self.post_attention_layernorm(op, hidden_states))
        return op.Add(residual, hidden_states), present_key, present_value
