"""The Mamba1 mixer: the token mixer of a "mamba" layer (Mamba, FalconMamba, Jamba), with two
states.

    x, z = split(in_proj(h))                          (intermediate each)
    x = silu(conv(x) + conv bias)                     conv: depthwise, causal
    dt, B, C = split(x_proj(x))                       (dt_rank, state_size, state_size)
    dt, B, C = norm(dt), norm(B), norm(C)             (config/mamba1.py's bc_norm, or none)
    dt = softplus(dt_proj(dt));  A = -exp(A_log)      (A [intermediate, state_size])
    h_t = exp(dt_t A) * h_{t-1} + (dt_t * x_t) B_t;  y_t = h_t C_t + D * x_t   (per channel)
    out = out_proj(y * silu(z))

The recurrence is com.microsoft::LinearAttention with update_rule "gated", as Mamba2's, with a
head per channel: q = C and k = B (one head, shared by every channel), v = dt * x (a value of
one per channel), the decay dt * A per channel and state entry ([B, T, intermediate *
state_size]). onnxruntime's CPU kernel runs it, and its Tier-1 body (components/
recurrent_bodies.py, a Scan over the tokens) runs where no kernel does. The convolution is
CausalConvWithState as LFM2's, Qwen3.5's and Mamba2's. From the scan's inputs to the gate
everything runs in float32 whatever the model dtype; the states are onnxruntime-genai's
`past_key_values.%d.conv_state` [batch, intermediate, taps - 1] and `.recurrent_state` [batch,
intermediate, state_size, 1] (float32). Padded positions (recurrent_padding.py) neither decay
nor feed the scan's state.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, in_float32, parameter
from mobius_genai.components.mamba2 import gated_scan
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.recurrent_padding import current_mask, real_tokens, zero_padding
from mobius_genai.components.short_conv import DepthwiseCausalConv
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.mamba1 import Mamba1Config


class Mamba1Mixer(nn.Module):
    """The `mamba` block; returns its output and the new conv and scan states."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        sizes: Mamba1Config = config.mamba1
        self.sizes = sizes
        hidden, inner = config.hidden_size, sizes.intermediate
        self.in_proj = Linear(hidden, 2 * inner, sizes.proj_bias)
        self.conv1d = DepthwiseCausalConv(inner, sizes.conv_kernel_size, sizes.conv_bias)
        self.x_proj = Linear(inner, sizes.dt_rank + 2 * sizes.state_size)
        self.dt_proj = Linear(sizes.dt_rank, inner, bias=True)
        self.A_log = parameter([inner, sizes.state_size])
        self.D = parameter([inner])
        self.out_proj = Linear(inner, hidden, sizes.proj_bias)
        self.dt_layernorm = self.b_layernorm = self.c_layernorm = None
        if sizes.bc_norm != "none":
            affine = sizes.bc_norm == "weighted"
            eps = sizes.bc_norm_eps
            self.dt_layernorm = RMSNorm(sizes.dt_rank, eps, affine=affine)
            self.b_layernorm = RMSNorm(sizes.state_size, eps, affine=affine)
            self.c_layernorm = RMSNorm(sizes.state_size, eps, affine=affine)

    def _normed(self, op, dt: ir.Value, b: ir.Value, c: ir.Value) -> list[ir.Value]:
        """dt, B and C through their norms, where the family has them."""
        if self.dt_layernorm is None:
            return [dt, b, c]
        norms = (self.dt_layernorm, self.b_layernorm, self.c_layernorm)
        return [norm(op, value) for norm, value in zip(norms, (dt, b, c), strict=True)]

    def _scan(
        self, op, x: ir.Value, dt: ir.Value, b: ir.Value, c: ir.Value, real: ir.Value, past
    ) -> tuple[ir.Value, ir.Value]:
        """y = the selective scan + D * x (float32, [batch, seq, intermediate]) and its state."""
        sizes = self.sizes
        dt = op.Softplus(in_float32(op, dt))  # [batch, seq, intermediate]
        a = op.Neg(op.Exp(in_float32(op, self.A_log)))  # [intermediate, state]
        decay = op.Mul(op.Unsqueeze(op.Mul(dt, real), op.Constant(value_ints=[3])), a)
        decay = op.Reshape(decay, op.Constant(value_ints=[0, 0, -1]))
        x = in_float32(op, x)
        heads = (1, sizes.intermediate)  # C and B shared by every channel, a head per channel
        y, present = gated_scan(op, c, b, op.Mul(dt, x), past, decay, *heads)
        return op.Add(y, op.Mul(x, in_float32(op, self.D))), present

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        attention_mask: ir.Value,
        past_conv: ir.Value,
        past_ssm: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        sizes = self.sizes
        current = current_mask(op, hidden_states, attention_mask)
        hidden_states = zero_padding(op, hidden_states, current)
        parts = op.Constant(value_ints=[sizes.intermediate, sizes.intermediate])
        x, gate = op.Split(self.in_proj(op, hidden_states), parts, axis=-1, _outputs=2)
        convolved, present_conv = self.conv1d.over_sequence(op, x, past_conv, current)
        x = zero_padding(op, activation(op, convolved, "silu"), current)
        split = op.Constant(value_ints=[sizes.dt_rank, sizes.state_size, sizes.state_size])
        dt, b, c = self._normed(op, *op.Split(self.x_proj(op, x), split, axis=-1, _outputs=3))
        real = real_tokens(op, current)
        y, present_ssm = self._scan(op, x, self.dt_proj(op, dt), b, c, real, past_ssm)
        gated = op.Mul(y, activation(op, in_float32(op, gate), "silu"))
        return self.out_proj(op, op.CastLike(gated, hidden_states)), present_conv, present_ssm
