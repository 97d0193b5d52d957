"""Kimi delta attention (KDA, Kimi Linear's "linear_attention" layers): the gated delta rule
with a decay per key channel instead of per head, with two states.

    q, k, v = silu(q_conv1d(q_proj(h))), ... each convolved apart (components/gated_delta_net.py)
    q, k    = l2norm per head (eps 1e-6); q *= head_dim ** -0.5
    g       = -exp(A_log[head]) * softplus(f_b_proj(f_a_proj(h)) + dt_bias)   per key channel
    beta    = sigmoid(b_proj(h))                   (both 0 at padded positions)
    o       = gated delta rule(q, k, v, g, beta)   S = exp(g_t) (per row of S) * S, ...
    out     = o_proj(rmsnorm_per_head(o) * o_norm.weight * sigmoid(g_b_proj(g_a_proj(h))))

The block is DeltaRuleBlock's with these gates; its norm and output projection are the
graph's `norm` and `out_proj`, which the kimi_linear row reads as `o_norm` and `o_proj`.

As many query/key heads as value heads, all of `head_dim`. The decay, the recurrence and the
gated norm run in float32 whatever the model dtype. The recurrence is the same
com.microsoft::LinearAttention (update_rule gated_delta) as Qwen3.5's, its decay
[batch, seq, heads * head_dim]; the states are the gated delta net's (config/recurrent.py).
"""

from __future__ import annotations

import onnx_ir as ir

from mobius_genai.components.gated_delta_net import DeltaRuleBlock
from mobius_genai.components.linear import Linear, in_float32, parameter
from mobius_genai.components.norms import make_norm
from mobius_genai.components.recurrent_padding import real_tokens
from mobius_genai.config import ArchitectureConfig


class KimiDeltaAttention(DeltaRuleBlock):
    """The KDA block; returns its output and the new conv and recurrent states."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__(config)
        sizes = self.sizes
        hidden, head_dim, heads = config.hidden_size, sizes.key_head_dim, sizes.key_heads
        self.b_proj = Linear(hidden, heads, False)
        self.f_a_proj = Linear(hidden, head_dim, False)
        self.f_b_proj = Linear(head_dim, sizes.key_dim, False)
        self.dt_bias = parameter([sizes.key_dim])
        self.A_log = parameter([1, 1, heads, 1])
        self.g_a_proj = Linear(hidden, head_dim, False)
        self.g_b_proj = Linear(head_dim, sizes.value_dim, False)
        eps = config.norm_eps if sizes.gated_norm_eps is None else sizes.gated_norm_eps
        self.norm = make_norm("rms", sizes.value_head_dim, eps)
        self.out_proj = Linear(sizes.value_dim, hidden, False)

    def _gates(self, op, hidden_states: ir.Value, current: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The log decay g [batch, seq, heads * head_dim] and beta [batch, seq, heads]
        (float32), both 0 at padded positions."""
        sizes = self.sizes
        forget = in_float32(op, self.f_b_proj(op, self.f_a_proj(op, hidden_states)))
        softplus = op.Softplus(op.Add(forget, in_float32(op, self.dt_bias)))
        heads = op.Constant(value_ints=[0, 0, sizes.key_heads, sizes.key_head_dim])
        rate = op.Reshape(op.Exp(in_float32(op, self.A_log)), op.Constant(value_ints=[-1, 1]))
        decay = op.Neg(op.Mul(op.Reshape(softplus, heads), rate))
        decay = op.Reshape(decay, op.Constant(value_ints=[0, 0, sizes.key_dim]))
        beta = op.Sigmoid(in_float32(op, self.b_proj(op, hidden_states)))
        real = real_tokens(op, current)
        return op.Mul(decay, real), op.Mul(beta, real)

    def _gate_projection(self, op, hidden_states: ir.Value) -> ir.Value:
        return self.g_b_proj(op, self.g_a_proj(op, hidden_states))

    def _output_gate(self, op, gate: ir.Value) -> ir.Value:
        """What the normed output is multiplied by: sigmoid of the low-rank gate (FLA's
        FusedRMSNormGated with activation "sigmoid")."""
        return op.Sigmoid(gate)
