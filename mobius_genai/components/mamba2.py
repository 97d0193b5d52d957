"""The Mamba2 mixer: the token mixer of a "mamba2" layer (Granite-4.0-H, Nemotron-H; beside
attention in Falcon-H1), with two states.

    gate, xBC, dt = split(in_proj(h))                 (intermediate, conv_dim, heads)
    x, B, C = split(silu(conv(xBC) + conv bias))      conv: depthwise, causal
    dt  = softplus(dt + dt_bias);  A = -exp(A_log)    (per head)
    S_t = exp(dt_t * A) * S_{t-1} + B_t ⊗ (dt_t * x_t);  y_t = C_t^T S_t + D * x_t
          (per head; each head reads the B and C of its group, heads repeat-interleaved)
    out = out_proj(group_rmsnorm(y * silu(gate)) * norm.weight)   (config/mamba2.py's norm:
          or group_rmsnorm(y) * norm.weight * silu(gate), or y * silu(gate) with no norm)

The recurrence is com.microsoft::LinearAttention with update_rule "gated" (q = C, k = B,
v = dt * x, decay = dt * A; no beta): onnxruntime's CPU kernel runs it, and its Tier-1 body
(components/recurrent_bodies.py, a Scan over the tokens) runs where no kernel does. The
convolution is CausalConvWithState as LFM2's and Qwen3.5's. The gated norm gates before it
normalizes (transformers' norm_before_gate=False) and normalizes each of `groups` groups of
channels apart. From the scan's inputs to the gated norm everything runs in float32 whatever
the model dtype; the states are onnxruntime-genai's `past_key_values.%d.conv_state` [batch,
conv_dim, taps - 1] and `.recurrent_state` [batch, heads, state_size, head_dim] (float32).
Padded positions (recurrent_padding.py) neither decay nor feed the scan's state.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, in_float32, parameter
from mobius_genai.components.recurrent_padding import current_mask, real_tokens, zero_padding
from mobius_genai.components.short_conv import DepthwiseCausalConv
from mobius_genai.components.tier1 import TIER1_OPS
from mobius_genai.config import ArchitectureConfig


class GatedGroupRMSNorm(nn.Module):
    """y * silu(gate), RMS-normalized over each of `groups` equal groups of channels and scaled
    by `weight` [channels], in float32 as transformers computes it, then in the model dtype;
    `norm_first`: y normalized and scaled first, then gated (Falcon-H1's norm_before_gate)."""

    def __init__(self, channels: int, groups: int, eps: float, norm_first: bool = False) -> None:
        super().__init__()
        self.channels, self.groups, self.eps = channels, groups, eps
        self.norm_first = norm_first
        self.weight = parameter([channels])

    def _normalize(self, op, x: ir.Value) -> ir.Value:
        split = op.Reshape(x, op.Constant(value_ints=[0, 0, self.groups, -1]))
        mean_square = op.ReduceMean(op.Mul(split, split), op.Constant(value_ints=[-1]), keepdims=1)
        eps = op.Constant(value_float=self.eps)
        normed = op.Div(split, op.Sqrt(op.Add(mean_square, eps)))
        normed = op.Reshape(normed, op.Constant(value_ints=[0, 0, self.channels]))
        return op.Mul(normed, in_float32(op, self.weight))

    def forward(self, op, y: ir.Value, gate: ir.Value, like: ir.Value) -> ir.Value:
        silu = _silu(op, in_float32(op, gate))
        if self.norm_first:
            return op.CastLike(op.Mul(self._normalize(op, y), silu), like)
        return op.CastLike(self._normalize(op, op.Mul(y, silu)), like)


class GateOnly(nn.Module):
    """y * silu(gate) with no norm (Falcon-H1 without mamba_rms_norm), in the model dtype."""

    def forward(self, op, y: ir.Value, gate: ir.Value, like: ir.Value) -> ir.Value:
        return op.CastLike(op.Mul(y, _silu(op, in_float32(op, gate))), like)


def _silu(op, x: ir.Value) -> ir.Value:
    return op.Mul(x, op.Sigmoid(x))


def gated_scan(
    op, c: ir.Value, b: ir.Value, value: ir.Value, past: ir.Value, decay: ir.Value, *heads: int
) -> tuple[ir.Value, ir.Value]:
    """The selective scan as com.microsoft::LinearAttention's gated rule (q = C, k = B, no
    beta), float32: its output [batch, seq, value channels] and new state. `heads`: the heads
    of C and B, then of the value and state (Mamba1: one, then one per channel)."""
    opset = op.builder.root.graph.opset_imports[""]
    function = TIER1_OPS["LinearAttention"].function("gated", opset)
    return op.call(
        function,
        in_float32(op, c),
        in_float32(op, b),
        value,
        past,
        decay,
        None,  # no beta: the gated rule adds k ⊗ v whole
        _outputs=2,
        q_num_heads=heads[0],
        kv_num_heads=heads[1],
        update_rule="gated",
        scale=1.0,
    )


def _gated_norm(config: ArchitectureConfig) -> nn.Module:
    """The module the scan's output and the gate go through (config/mamba2.py's `norm`)."""
    sizes = config.mamba2
    if sizes.norm == "gate":
        return GateOnly()
    first = sizes.norm == "norm_then_gate"
    return GatedGroupRMSNorm(sizes.intermediate, sizes.groups, config.norm_eps, first)


class Mamba2Mixer(nn.Module):
    """The `mamba` block; returns its output and the new conv and scan states."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        sizes = config.mamba2
        self.sizes = sizes
        hidden, inner = config.hidden_size, sizes.intermediate
        self.in_proj = Linear(hidden, inner + sizes.conv_dim + sizes.heads, sizes.proj_bias)
        self.conv1d = DepthwiseCausalConv(sizes.conv_dim, sizes.conv_kernel_size, sizes.conv_bias)
        self.dt_bias = parameter([sizes.heads])
        self.A_log = parameter([sizes.heads])
        self.D = parameter([sizes.heads])
        self.norm = _gated_norm(config)
        self.out_proj = Linear(inner, hidden, sizes.out_bias)

    def _heads(self, op, x: ir.Value) -> ir.Value:
        """[batch, seq, intermediate] → [batch, seq, heads, head_dim]."""
        return op.Reshape(x, op.Constant(value_ints=[0, 0, self.sizes.heads, -1]))

    def _scan(
        self, op, x: ir.Value, b: ir.Value, c: ir.Value, dt: ir.Value, real: ir.Value, past
    ) -> tuple[ir.Value, ir.Value]:
        """y = the selective scan + D * x (float32, [batch, seq, intermediate]) and its state."""
        sizes = self.sizes
        dt = op.Softplus(op.Add(in_float32(op, dt), in_float32(op, self.dt_bias)))
        decay = op.Mul(op.Mul(dt, op.Neg(op.Exp(in_float32(op, self.A_log)))), real)
        x_heads = self._heads(op, in_float32(op, x))
        flat = op.Constant(value_ints=[0, 0, sizes.intermediate])
        value = op.Reshape(op.Mul(x_heads, op.Unsqueeze(dt, op.Constant(value_ints=[3]))), flat)
        y, present = gated_scan(op, c, b, value, past, decay, sizes.groups, sizes.heads)
        skip = op.Mul(x_heads, op.Unsqueeze(in_float32(op, self.D), op.Constant(value_ints=[1])))
        return op.Add(y, op.Reshape(skip, flat)), present

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
        parts = op.Constant(value_ints=[sizes.intermediate, sizes.conv_dim, sizes.heads])
        gate, xbc, dt = op.Split(self.in_proj(op, hidden_states), parts, axis=-1, _outputs=3)
        convolved, present_conv = self.conv1d.over_sequence(op, xbc, past_conv, current)
        convolved = zero_padding(op, op.Mul(convolved, op.Sigmoid(convolved)), current)
        groups = sizes.groups * sizes.state_size
        split = op.Constant(value_ints=[sizes.intermediate, groups, groups])
        x, b, c = op.Split(convolved, split, axis=-1, _outputs=3)
        real = real_tokens(op, current)
        y, present_ssm = self._scan(op, x, b, c, dt, real, past_ssm)
        normed = self.norm(op, y, gate, hidden_states)
        return self.out_proj(op, normed), present_conv, present_ssm
