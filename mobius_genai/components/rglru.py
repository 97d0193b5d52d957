"""RecurrentGemma's recurrent block (Griffin's): a short conv and the real-gated linear
recurrent unit (RG-LRU), gated by a GeLU branch, with two states.

    y = gelu_tanh(linear_y(h));  x = conv_1d(linear_x(h))          conv: depthwise, causal
    i_t = sigmoid(x_t W_i + b_i);  r_t = sigmoid(x_t W_a + b_a)     W: block-diagonal, a block
                                                                     per head [heads, bw, bw]
    log a_t = -8 r_t softplus(recurrent_param)                      (per channel)
    h_t = a_t h_{t-1} + m_t (i_t x_t),  m_t = sqrt(1 - a_t^2), or 1 where the position is 0
    out = linear_out(h * y)

The recurrence is com.microsoft::LinearAttention's gated rule as Mamba1's (components/
mamba1.py), a head per channel with a key and value of one: q = k = 1, v = m i x, the decay
log a. transformers also zeroes the state at position 0 (a reset); there it is the zero state
already, as padding never feeds it, so only the multiplier follows the reset, which the
attention mask gives: a row's first real token. From the gates to the output everything runs in
float32 whatever the model dtype; the states are onnxruntime-genai's
`past_key_values.%d.conv_state` [batch, width, taps - 1] and `.recurrent_state` [batch, width,
1, 1] (float32). Padded positions (recurrent_padding.py) feed neither the conv nor the scan.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, in_float32, parameter
from mobius_genai.components.mamba2 import gated_scan
from mobius_genai.components.mlp import activation
from mobius_genai.components.recurrent_padding import current_mask, real_tokens, zero_padding
from mobius_genai.components.short_conv import DepthwiseCausalConv
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.rglru import RgLruConfig

#: Griffin's constant c in log a = -c * r * softplus(Λ).
RECURRENCE_SCALE = 8.0


def decay_rate(op, recurrent_param: ir.Value) -> ir.Value:
    """softplus(Λ) in float32: each channel's largest log-decay, before -c and the gate."""
    return op.Softplus(in_float32(op, recurrent_param))


class RgLru(nn.Module):
    """The RG-LRU's gates and decay parameter (checkpoint `rg_lru.*`)."""

    def __init__(self, sizes: RgLruConfig) -> None:
        super().__init__()
        self.sizes = sizes
        blocks = [sizes.heads, sizes.block_width, sizes.block_width]
        self.recurrent_param = parameter([sizes.width])
        self.input_gate_weight = parameter(blocks)
        self.input_gate_bias = parameter(blocks[:2])
        self.recurrent_gate_weight = parameter(blocks)
        self.recurrent_gate_bias = parameter(blocks[:2])

    def _gate(self, op, x: ir.Value, weight: ir.Value, bias: ir.Value) -> ir.Value:
        """sigmoid(x W + b) with W block-diagonal: x [batch, seq, width] float32."""
        sizes = self.sizes
        blocks = op.Reshape(x, op.Constant(value_ints=[0, 0, sizes.heads, 1, sizes.block_width]))
        mixed = op.MatMul(blocks, in_float32(op, weight))  # [batch, seq, heads, 1, bw]
        flat = op.Reshape(mixed, op.Constant(value_ints=[0, 0, sizes.width]))
        width = op.Constant(value_ints=[sizes.width])
        return op.Sigmoid(op.Add(flat, op.Reshape(in_float32(op, bias), width)))

    def forward(
        self, op, x: ir.Value, first: ir.Value, real: ir.Value, past: ir.Value
    ) -> tuple[ir.Value, ir.Value]:
        """The recurrence's output [batch, seq, width] (float32) and new state, from x (float32),
        `first` ([batch, seq, 1] bool: a row's first real token) and `real` (recurrent_padding's
        real_tokens)."""
        input_gate = self._gate(op, x, self.input_gate_weight, self.input_gate_bias)
        rate = self._gate(op, x, self.recurrent_gate_weight, self.recurrent_gate_bias)
        scale = op.Constant(value_float=-RECURRENCE_SCALE)
        log_a = op.Mul(op.Mul(rate, scale), decay_rate(op, self.recurrent_param))
        one = op.Constant(value_float=1.0)
        normalizer = op.Sqrt(op.Sub(one, op.Exp(op.Add(log_a, log_a))))
        normalizer = op.Where(first, one, normalizer)
        value = op.Mul(op.Mul(op.Mul(x, input_gate), normalizer), real)
        # q = k = 1 for a real token ([batch, seq, 1], shared by every channel), 0 for padding
        return gated_scan(op, real, real, value, past, op.Mul(log_a, real), 1, self.sizes.width)


def _first_real_tokens(op, hidden_states: ir.Value, attention_mask: ir.Value) -> ir.Value:
    """[batch, seq, 1] bool: this call's tokens that are their row's first real one (position 0)."""
    current = current_mask(op, hidden_states, attention_mask)
    counts = current_mask(op, hidden_states, op.CumSum(attention_mask, op.Constant(value_int=1)))
    first = op.Equal(op.Mul(counts, current), op.Constant(value_int=1))
    return op.Unsqueeze(first, op.Constant(value_ints=[2]))


class RgLruBlock(nn.Module):
    """The `temporal_block` of an "rglru" layer; returns its output and the new conv and
    recurrence states."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        sizes: RgLruConfig = config.rglru
        hidden, width = config.hidden_size, sizes.width
        self.act = config.hidden_act
        self.linear_y = Linear(hidden, width, bias=True)
        self.linear_x = Linear(hidden, width, bias=True)
        self.linear_out = Linear(width, hidden, bias=True)
        self.conv_1d = DepthwiseCausalConv(width, sizes.conv_kernel_size, bias=True)
        self.rg_lru = RgLru(sizes)

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        attention_mask: ir.Value,
        past_conv: ir.Value,
        past_state: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        current = current_mask(op, hidden_states, attention_mask)
        y = activation(op, self.linear_y(op, hidden_states), self.act)
        x = zero_padding(op, self.linear_x(op, hidden_states), current)
        convolved, present_conv = self.conv_1d.over_sequence(op, x, past_conv, current)
        first = _first_real_tokens(op, hidden_states, attention_mask)
        scanned, present_state = self.rg_lru(
            op, in_float32(op, convolved), first, real_tokens(op, current), past_state
        )
        mixed = op.Mul(op.CastLike(scanned, hidden_states), y)
        return self.linear_out(op, mixed), present_conv, present_state
