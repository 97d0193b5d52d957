"""Qwen3.5's gated delta net: the token mixer of a "linear_attention" layer, with two states.

    q, k, v = split(silu(conv([q | k | v] = in_proj_qkv(h))))        conv: depthwise, causal
    q, k    = l2norm per head (eps 1e-6); q *= key_head_dim ** -0.5
    g       = -exp(A_log) * softplus(in_proj_a(h) + dt_bias);  beta = sigmoid(in_proj_b(h))
              (both 0 at padded positions: recurrent_padding.py)
    o       = gated delta rule(q, k, v, g, beta)  (key heads repeat-interleaved onto value heads)
    out     = out_proj(rmsnorm_per_value_head(o) * norm.weight * silu(in_proj_z(h)))

From the convolution's output to the gated norm everything runs in float32 whatever the model
dtype, as transformers computes it (the decay compounds over the tokens). The convolution is
com.microsoft::CausalConvWithState (SiLU) and the recurrence
com.microsoft::LinearAttention (update_rule gated_delta), Tier-1 functions whose bodies are in
components/recurrent_bodies.py; their states are onnxruntime-genai's
`past_key_values.%d.conv_state` [batch, conv_dim, taps - 1] and `.recurrent_state`
[batch, value_heads, key_head_dim, value_head_dim]. The gated norm scales by `weight` where the
model's other norms use 1 + weight (the family row offsets only those).

Variants (config/linear_attention.py): q, k and v projected and convolved apart (q_proj,
q_conv1d, ...: `separate_qkv`, OLMo hybrid's checkpoints), their conv states still one
[batch, conv_dim, taps - 1] state split by channels; beta scaled (`beta_scale`); the gated
norm's own epsilon (`gated_norm_eps`).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, in_float32, parameter
from mobius_genai.components.norms import make_norm
from mobius_genai.components.recurrent_padding import current_mask, real_tokens, zero_padding
from mobius_genai.components.short_conv import DepthwiseCausalConv
from mobius_genai.components.tier1 import TIER1_OPS
from mobius_genai.config import ArchitectureConfig

_L2_EPS = 1e-6  # transformers' l2norm (FLA's)


def _l2_normalized(op, x: ir.Value, heads: int, head_dim: int) -> ir.Value:
    """Each head of [batch, seq, heads * head_dim] divided by sqrt(sum of squares + eps)."""
    split = op.Reshape(x, op.Constant(value_ints=[0, 0, heads, head_dim]))
    squares = op.ReduceSum(op.Mul(split, split), op.Constant(value_ints=[-1]), keepdims=1)
    eps = op.CastLike(op.Constant(value_float=_L2_EPS), x)
    normed = op.Div(split, op.Sqrt(op.Add(squares, eps)))
    return op.Reshape(normed, op.Constant(value_ints=[0, 0, heads * head_dim]))


class DeltaRuleBlock(nn.Module):
    """What the delta-rule blocks share (Qwen3.5's gated delta net, Kimi's delta attention):
    q, k and v projected and convolved (one projection and conv, or each apart), then the
    delta rule over l2-normed heads, normed per value head and gated; each subclass adds its
    gates (`_gates`), its output gate (`_gate_projection`, `_output_gate`), `norm` and
    `out_proj`."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        sizes = config.linear_attention
        self.sizes = sizes
        hidden = config.hidden_size
        taps = sizes.conv_kernel_size
        if sizes.separate_qkv:
            for part, width in zip("qkv", self._widths(), strict=True):
                setattr(self, f"{part}_proj", Linear(hidden, width, False))
                conv = DepthwiseCausalConv(width, taps, False, activation="silu")
                setattr(self, f"{part}_conv1d", conv)
        else:
            self.in_proj_qkv = Linear(hidden, sizes.conv_dim, False)
            self.conv1d = DepthwiseCausalConv(sizes.conv_dim, taps, False, activation="silu")

    def _widths(self) -> tuple[int, int, int]:
        sizes = self.sizes
        return sizes.key_dim, sizes.key_dim, sizes.value_dim

    def _convolved(
        self, op, hidden_states: ir.Value, past_conv: ir.Value, current: ir.Value
    ) -> tuple[ir.Value, ir.Value]:
        """[q | k | v] convolved, [batch, seq, conv_dim], and the conv state: one projection
        and conv, or q, k and v each through their own, the state split by their channels."""
        if not self.sizes.separate_qkv:
            mixed = self.in_proj_qkv(op, hidden_states)
            return self.conv1d.over_sequence(op, mixed, past_conv, current)
        widths = op.Constant(value_ints=list(self._widths()))
        pasts = op.Split(past_conv, widths, axis=1, _outputs=3)
        outputs, states = [], []
        for part, past in zip("qkv", pasts, strict=True):
            projected = getattr(self, f"{part}_proj")(op, hidden_states)
            conv = getattr(self, f"{part}_conv1d")
            output, state = conv.over_sequence(op, projected, past, current)
            outputs.append(output)
            states.append(state)
        return op.Concat(*outputs, axis=-1), op.Concat(*states, axis=1)

    def attend(
        self, op, mixed: ir.Value, decay: ir.Value, beta: ir.Value, past: ir.Value
    ) -> tuple[ir.Value, ir.Value]:
        sizes = self.sizes
        split = op.Constant(value_ints=[sizes.key_dim, sizes.key_dim, sizes.value_dim])
        q, k, v = op.Split(mixed, split, axis=-1, _outputs=3)
        q = _l2_normalized(op, q, sizes.key_heads, sizes.key_head_dim)
        q = op.Mul(q, op.CastLike(op.Constant(value_float=sizes.key_head_dim**-0.5), q))
        k = _l2_normalized(op, k, sizes.key_heads, sizes.key_head_dim)
        opset = op.builder.root.graph.opset_imports[""]
        function = TIER1_OPS["LinearAttention"].function("", opset)
        return op.call(
            function,
            q,
            k,
            v,
            past,
            decay,
            beta,
            _outputs=2,
            q_num_heads=sizes.key_heads,
            kv_num_heads=sizes.value_heads,
            update_rule="gated_delta",
            scale=1.0,  # q is scaled above, as onnxruntime-genai's builder does
        )

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        attention_mask: ir.Value,
        past_conv: ir.Value,
        past_recurrent: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        """The block's output and its new conv and recurrent states: the delta rule over the
        convolved q, k and v with the subclass's gates, its output normed per value head and
        times the subclass's output gate, through out_proj."""
        sizes = self.sizes
        current = current_mask(op, hidden_states, attention_mask)
        hidden_states = zero_padding(op, hidden_states, current)
        convolved, present_conv = self._convolved(op, hidden_states, past_conv, current)
        decay, beta = self._gates(op, hidden_states, current)
        output, present_recurrent = self.attend(
            op, in_float32(op, convolved), decay, beta, past_recurrent
        )
        output = op.CastLike(output, hidden_states)
        heads = [0, 0, sizes.value_heads, sizes.value_head_dim]
        normed = self.norm(op, op.Reshape(output, op.Constant(value_ints=heads)))
        normed = op.Reshape(normed, op.Constant(value_ints=[0, 0, sizes.value_dim]))
        gate = self._gate_projection(op, hidden_states)
        gated = op.Mul(normed, self._output_gate(op, gate))
        return self.out_proj(op, gated), present_conv, present_recurrent


class GatedDeltaNet(DeltaRuleBlock):
    """The `linear_attn` block; returns its output and the new conv and recurrent states."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__(config)
        sizes = self.sizes
        hidden = config.hidden_size
        self.in_proj_z = Linear(hidden, sizes.value_dim, False)
        self.in_proj_b = Linear(hidden, sizes.value_heads, False)
        self.in_proj_a = Linear(hidden, sizes.value_heads, False)
        self.dt_bias = parameter([sizes.value_heads])
        self.A_log = parameter([sizes.value_heads])
        eps = config.norm_eps if sizes.gated_norm_eps is None else sizes.gated_norm_eps
        self.norm = make_norm("rms", sizes.value_head_dim, eps)
        self.out_proj = Linear(sizes.value_dim, hidden, False)

    def _gates(self, op, hidden_states: ir.Value, current: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The log decay g and the update rate beta, [batch, seq, value_heads] each (float32),
        both 0 at padded positions: the state neither decays nor learns there."""
        a = in_float32(op, self.in_proj_a(op, hidden_states))
        softplus = op.Softplus(op.Add(a, in_float32(op, self.dt_bias)))
        decay = op.Mul(op.Neg(op.Exp(in_float32(op, self.A_log))), softplus)
        beta = op.Sigmoid(in_float32(op, self.in_proj_b(op, hidden_states)))
        if self.sizes.beta_scale != 1.0:
            beta = op.Mul(beta, op.Constant(value_float=self.sizes.beta_scale))
        real = real_tokens(op, current)
        return op.Mul(decay, real), op.Mul(beta, real)

    def _gate_projection(self, op, hidden_states: ir.Value) -> ir.Value:
        return self.in_proj_z(op, hidden_states)

    def _output_gate(self, op, gate: ir.Value) -> ir.Value:
        """What the normed output is multiplied by: silu of in_proj_z's gate."""
        return op.Mul(gate, op.Sigmoid(gate))
