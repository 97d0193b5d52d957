"""LFM2's short-convolution block: a gated depthwise causal convolution with a carried state.

    B, C, x = split(in_proj(h))          (each [batch, hidden, seq] after a transpose)
    y = out_proj(C * conv(B * x))        conv: depthwise, causal, `conv_kernel_size` taps

The convolution is the Tier-1 op com.microsoft::CausalConvWithState (components/tier1.py
holds its standard body), whose state is the last `conv_kernel_size - 1` columns of
[state | B * x]: onnxruntime-genai's `past.%d.conv` / `present.%d.conv` of [batch, hidden,
conv_kernel_size - 1], taken after each row's last real token (recurrent_padding.py: padding
on either side stays out of the state).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.recurrent_padding import (
    current_mask,
    state_after_last_token,
    zero_padding,
)
from mobius_genai.components.tier1 import TIER1_OPS
from mobius_genai.config import ArchitectureConfig


class DepthwiseCausalConv(nn.Module):
    """The kernel [channels, 1, taps] (and bias) of a depthwise causal convolution with a carried
    state (checkpoint names `<module>.weight` / `.bias`), then `activation` ("none" or "silu")."""

    def __init__(self, channels: int, taps: int, bias: bool, activation: str = "none") -> None:
        super().__init__()
        if bias and activation != "none":
            raise ValueError("a conv bias is added after the op, so only without an activation")
        self.activation = activation
        self.taps = taps
        self.weight = parameter([channels, 1, taps])
        self.bias = parameter([channels]) if bias else None

    def forward(
        self, op, x: ir.Value, past_state: ir.Value, current: ir.Value
    ) -> tuple[ir.Value, ir.Value]:
        """Output and the state after each row's last real token (`current`: this call's mask
        columns; recurrent_padding.py)."""
        opset = op.builder.root.graph.opset_imports[""]
        overload = "" if self.activation == "none" else self.activation
        function = TIER1_OPS["CausalConvWithState"].function(overload, opset)
        output, _ = op.call(
            function,
            x,
            self.weight,
            None,
            past_state,
            _outputs=2,
            activation=self.activation,
            ndim=1,
        )
        if self.bias is not None:  # with no activation, a bias after the op is the same
            output = op.Add(output, op.Unsqueeze(self.bias, op.Constant(value_ints=[1])))
        window = op.Concat(past_state, x, axis=-1)
        return output, state_after_last_token(op, window, current, self.taps - 1)

    def over_sequence(
        self, op, x: ir.Value, past_state: ir.Value, current: ir.Value
    ) -> tuple[ir.Value, ir.Value]:
        """`forward` of x [batch, seq, channels] (a projection's output as it comes), the
        output [batch, seq, channels] too; the state as `forward`'s."""
        output, state = self(op, op.Transpose(x, perm=[0, 2, 1]), past_state, current)
        return op.Transpose(output, perm=[0, 2, 1]), state


class ShortConv(nn.Module):
    """The operator block of an LFM2 "conv" layer; returns its output and the new state."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.hidden = hidden
        conv = config.short_conv
        self.in_proj = Linear(hidden, 3 * hidden, conv.bias)
        self.conv = DepthwiseCausalConv(hidden, conv.kernel_size, conv.bias)
        self.out_proj = Linear(hidden, hidden, conv.bias)

    def forward(
        self, op, hidden_states: ir.Value, attention_mask: ir.Value, past_state: ir.Value
    ) -> tuple[ir.Value, ir.Value]:
        current = current_mask(op, hidden_states, attention_mask)
        masked = zero_padding(op, hidden_states, current)
        projected = op.Transpose(self.in_proj(op, masked), perm=[0, 2, 1])
        b, c, x = op.Split(projected, num_outputs=3, axis=1, _outputs=3)
        conv_out, present = self.conv(op, op.Mul(b, x), past_state, current)
        gated = op.Transpose(op.Mul(c, conv_out), perm=[0, 2, 1])
        return self.out_proj(op, gated), present
