"""MiniMax's lightning attention: linear attention with a fixed per-head exponential decay.

    [q_h | k_h | v_h] = silu(qkv_proj(h))                       per head, head_dim each
    S_t = exp(-slope_h) S_{t-1} + k_t ⊗ v_t;  o_t = q_t^T S_t    (no softmax, no scale)
    out = out_proj(sigmoid(output_gate(h)) * rms_norm(o))       the norm over all heads

transformers computes the prefill block by block (intra-block QK^T with a decay mask, inter-
block through S) and decode steps token by token; both are the recurrence above, which is
com.microsoft::LinearAttention's gated rule (components/mamba2.py's gated_scan) with the decay
-slope_h at every real token. The slopes (config/lightning_attention.py) differ by layer, so the
block is built with its layer's index. Padded positions neither decay nor update S (their
q, k, v are zero, their decay 0). The states are onnxruntime-genai's
`past_key_values.%d.recurrent_state` [batch, heads, head_dim, head_dim] (float32) and a
`.conv_state` [batch, 1, 1] carried unchanged: og 0.18 finds recurrent layers by that name.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, in_float32
from mobius_genai.components.mamba2 import gated_scan
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.recurrent_padding import current_mask, real_tokens, zero_padding
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.lightning_attention import LightningAttentionConfig


def decay(op, slopes: tuple[float, ...], real: ir.Value) -> ir.Value:
    """[batch, seq, heads] float32: -slope_h at a real token, 0 at padding (`real`:
    recurrent_padding's real_tokens)."""
    return op.Mul(real, op.Constant(value_floats=[-slope for slope in slopes]))


def split_heads(op, qkv: ir.Value, sizes: LightningAttentionConfig) -> list[ir.Value]:
    """q, k, v packed [batch, seq, heads * head_dim] from [q_h | k_h | v_h] for each head."""
    per_head = op.Reshape(qkv, op.Constant(value_ints=[0, 0, sizes.heads, 3 * sizes.head_dim]))
    packed = op.Constant(value_ints=[0, 0, sizes.width])
    return [
        op.Reshape(part, packed) for part in op.Split(per_head, axis=3, num_outputs=3, _outputs=3)
    ]


class LightningAttention(nn.Module):
    """The `self_attn` of a "lightning_attention" layer (checkpoint names: qkv_proj, out_proj,
    output_gate, norm); returns its output and the new conv and recurrent states."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        sizes: LightningAttentionConfig = config.lightning_attention
        self.sizes = sizes
        self.slopes = sizes.slopes[layer_index]
        self.act = config.hidden_act
        hidden = config.hidden_size
        self.qkv_proj = Linear(hidden, 3 * sizes.width, bias=False)
        self.output_gate = Linear(hidden, sizes.width, bias=False)
        self.out_proj = Linear(sizes.width, hidden, bias=False)
        self.norm = RMSNorm(sizes.width, sizes.norm_eps)

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        attention_mask: ir.Value,
        past_conv: ir.Value,
        past_state: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        sizes = self.sizes
        current = current_mask(op, hidden_states, attention_mask)
        qkv = activation(op, self.qkv_proj(op, hidden_states), self.act)
        query, key, value = split_heads(op, zero_padding(op, qkv, current), sizes)
        real = real_tokens(op, current)
        output, present_state = gated_scan(
            op,
            query,
            key,
            in_float32(op, value),
            past_state,
            decay(op, self.slopes, real),
            sizes.heads,
            sizes.heads,
        )
        normed = self.norm(op, op.CastLike(output, hidden_states))
        gated = op.Mul(op.Sigmoid(self.output_gate(op, hidden_states)), normed)
        return self.out_proj(op, gated), op.Identity(past_conv), present_state
