"""Gemma 4's decoder layer (config/per_layer_stack.py): sandwich-normed attention and MLP, an
MoE block beside the MLP, the per-layer input gated into the residual, the whole output scaled
by the layer's `layer_scalar`.

    h = x + norm(attn(norm(x)))
    m = mlp(norm(h));  with experts: m = norm1(m) + norm2(experts(norm3(h), router(h)))
    y = h + norm(m)
    y = y + norm(proj(act(gate(y)) * per_layer_input))      with per-layer inputs
    out = y * layer_scalar

Attention is Gemma 3n's (components/altup_layer.py's SharedKVAttention) with the layer's own
head size and key/value heads, and V = K in the full layers when the config says so; a layer
sharing an earlier layer's cache attends over its source's keys through the same Attention
feeds, so og keeps a past/present per layer.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.altup_layer import KeysValues, SharedKVAttention
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import GatedMLP, activation
from mobius_genai.components.moe import Experts
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.stack_experts import StackRouter, geglu_experts
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.per_layer_stack import FULL

_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
_EXPERT_NORMS = (
    "post_feedforward_layernorm_1",
    "post_feedforward_layernorm_2",
    "pre_feedforward_layernorm_2",
)


class PerLayerDecoderLayer(nn.Module):
    """One Gemma 4 layer (see the module docstring); module names as transformers'."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        stack, hidden, eps = config.per_layer_stack, config.hidden_size, config.norm_eps
        self.act = config.hidden_act
        full = config.layer_types[layer_index] == FULL
        self.self_attn = SharedKVAttention(config, layer_index, stack.keys_are_values and full)
        self.mlp = GatedMLP(hidden, stack.intermediate_sizes[layer_index], config.hidden_act)
        for name in _NORMS:
            setattr(self, name, RMSNorm(hidden, eps))
        self.moe, self.router, self.experts = stack.experts, None, None
        if self.moe is not None:
            self.router = StackRouter(hidden, self.moe.num_experts, eps)
            self.experts = Experts(self.moe, hidden)
            for name in _EXPERT_NORMS:
                setattr(self, name, RMSNorm(hidden, eps))
        self.per_layer_input_gate = self.per_layer_projection = None
        if stack.per_layer_size:
            self.per_layer_input_gate = Linear(hidden, stack.per_layer_size)
            self.per_layer_projection = Linear(stack.per_layer_size, hidden)
            self.post_per_layer_input_norm = RMSNorm(hidden, eps)
        self.layer_scalar = parameter([1])

    def _feed_forward(self, op, hidden: ir.Value) -> ir.Value:
        out = self.mlp(op, self.pre_feedforward_layernorm(op, hidden))
        if self.experts is not None:
            normed = self.pre_feedforward_layernorm_2(op, hidden)
            experts = geglu_experts(op, normed, self.router, self.experts, self.moe, hidden)
            out = op.Add(
                self.post_feedforward_layernorm_1(op, out),
                self.post_feedforward_layernorm_2(op, experts),
            )
        return op.Add(hidden, self.post_feedforward_layernorm(op, out))

    def forward(
        self, op, hidden, per_layer_input, position_ids, rotary, bias, past, slots, shared
    ) -> tuple[ir.Value, tuple[ir.Value, ir.Value], KeysValues]:
        """(output, (present key, present value), the keys and values it attended over);
        `shared` is the source layer's keys and values when this layer shares them."""
        attn, present_key, present_value, kv = self.self_attn(
            op, self.input_layernorm(op, hidden), position_ids, rotary, bias, past, slots, shared
        )
        hidden = self._feed_forward(op, op.Add(hidden, self.post_attention_layernorm(op, attn)))
        if self.per_layer_input_gate is not None:
            gate = activation(op, self.per_layer_input_gate(op, hidden), self.act)
            added = self.per_layer_projection(op, op.Mul(gate, per_layer_input))
            hidden = op.Add(hidden, self.post_per_layer_input_norm(op, added))
        return op.Mul(hidden, self.layer_scalar), (present_key, present_value), kv
