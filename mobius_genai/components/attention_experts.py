"""JetMoE's mixture of attention heads (config/attention_experts.py): a router picks `top_k`
attention experts per token; expert e owns a query projection Wq_e [width, hidden] and an
output projection Wo_e [hidden, width] (width = kv heads * head_dim), all share `kv_proj`.

For the token's picks e_1..e_k (the top-k router logits, softmaxed over the k: g_1..g_k),
pick i's queries Wq_{e_i} x are kv-heads heads that attend with the shared keys and values
(transformers' `repeat`: query head (i, j) reads key/value head j), and

    out = sum_i g_i Wo_{e_i} a_i + bias        (a_i: pick i's attention output)

Every expert's queries are computed (one batched MatMul over the stored [experts, width,
hidden] tensor) and each pick's taken by a one-hot MatMul; the query heads are reordered to
(j, i), so that one Attention node runs them as grouped-query attention with top_k query heads
per key/value head (GroupQueryAttention on the EPs that fuse it). The outputs, weighted by
g_i, are scattered back to their experts (zero elsewhere) and every expert's Wo applied in one
batched MatMul summed over the experts: the same sum, since a token's picks are distinct.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.kv_slots import Slots, place
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.rope import Rotation
from mobius_genai.config import ArchitectureConfig


class _Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.layer = Linear(hidden, num_experts)

    def forward(self, op, x: ir.Value) -> ir.Value:
        return self.layer(op, x)


class _Stacked(nn.Module):
    """One [experts, out, in] tensor of every expert's projection, as stored."""

    def __init__(self, shape: list[int]) -> None:
        super().__init__()
        self.weight = parameter(shape)

    def forward(self, op) -> ir.Value:
        return self.weight


class AttentionExpertWeights(nn.Module):
    """The router and the stacked projections, named as JetMoeMoA's checkpoint tensors."""

    def __init__(self, num_experts: int, hidden: int, width: int) -> None:
        super().__init__()
        self.router = _Router(hidden, num_experts)
        self.input_linear = _Stacked([num_experts, width, hidden])
        self.output_linear = _Stacked([num_experts, hidden, width])
        self.bias = parameter([hidden])

    def forward(self, op, tokens: ir.Value) -> tuple[ir.Value, ...]:
        """The router's logits of `tokens`, the query and output projections, the bias."""
        return self.router(op, tokens), self.input_linear(op), self.output_linear(op), self.bias


class MixtureOfHeadsAttention(nn.Module):
    """One layer's mixture of attention heads (module docstring)."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        section = config.attention_experts
        self.num_experts, self.top_k = section.num_experts, section.top_k
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.hidden = config.hidden_size
        self.width = self.num_kv_heads * self.head_dim
        self.scale = config.scale
        self.experts = AttentionExpertWeights(self.num_experts, self.hidden, self.width)
        self.kv_proj = Linear(self.hidden, 2 * self.width)

    def _picks(self, op, logits: ir.Value) -> tuple[ir.Value, ir.Value]:
        """[tokens, k, experts] one-hot picks and the [tokens, k, 1] gates (a softmax over
        the top-k router `logits`)."""
        k = op.Constant(value_ints=[self.top_k])
        top, index = op.TopK(logits, k, axis=-1, _outputs=2)
        gates = op.Unsqueeze(op.Softmax(top, axis=-1), op.Constant(value_ints=[-1]))
        experts = op.Constant(value_ints=list(range(self.num_experts)))
        chosen = op.Equal(op.Unsqueeze(index, op.Constant(value_ints=[-1])), experts)
        return op.CastLike(chosen, logits), gates

    def _queries(self, op, tokens: ir.Value, stacked: ir.Value, picks: ir.Value) -> ir.Value:
        """[tokens, kv_heads * top_k * head_dim]: each pick's queries from the `stacked`
        query projections, heads ordered (j, i)."""
        every = op.MatMul(stacked, op.Transpose(tokens, perm=[1, 0]))
        every = op.Transpose(every, perm=[2, 0, 1])  # [tokens, experts, width]
        picked = op.MatMul(picks, every)  # [tokens, k, width]
        heads = [-1, self.top_k, self.num_kv_heads, self.head_dim]
        by_pick = op.Reshape(picked, op.Constant(value_ints=heads))
        by_group = op.Transpose(by_pick, perm=[0, 2, 1, 3])
        return op.Reshape(by_group, op.Constant(value_ints=[-1, self.top_k * self.width]))

    def _output(
        self, op, attended: ir.Value, picks: ir.Value, gates: ir.Value, stacked: ir.Value
    ) -> ir.Value:
        """[tokens, hidden]: sum_i g_i Wo_{e_i} a_i (Wo: the `stacked` output projections),
        `attended` [tokens, heads * d] in (j, i) order."""
        heads = [-1, self.num_kv_heads, self.top_k, self.head_dim]
        by_group = op.Reshape(attended, op.Constant(value_ints=heads))
        by_pick = op.Transpose(by_group, perm=[0, 2, 1, 3])
        per_pick = op.Reshape(by_pick, op.Constant(value_ints=[0, self.top_k, self.width]))
        weighted = op.Transpose(op.Mul(picks, gates), perm=[0, 2, 1])  # [tokens, experts, k]
        per_expert = op.MatMul(weighted, per_pick)  # [tokens, experts, width]
        by_expert = op.Transpose(per_expert, perm=[1, 2, 0])  # [experts, width, tokens]
        out = op.MatMul(stacked, by_expert)  # [experts, hidden, tokens]
        summed = op.ReduceSum(out, op.Constant(value_ints=[0]), keepdims=0)
        return op.Transpose(summed, perm=[1, 0])

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        position_ids: ir.Value,
        rotary: Rotation | None,
        attention_bias: ir.Value,
        past_key: ir.Value,
        past_value: ir.Value,
        slots: Slots | None = None,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        """(output [b, s, hidden], present key, present value [b, kv, total, d])."""
        tokens = op.Reshape(hidden_states, op.Constant(value_ints=[-1, self.hidden]))
        logits, queries, outputs, bias = self.experts(op, tokens)
        picks, gates = self._picks(op, logits)
        batch_seq = op.Shape(hidden_states, start=0, end=2)
        width = op.Constant(value_ints=[self.top_k * self.width])
        q = op.Reshape(
            self._queries(op, tokens, queries, picks), op.Concat(batch_seq, width, axis=0)
        )
        k, v = op.Split(self.kv_proj(op, hidden_states), num_outputs=2, axis=-1, _outputs=2)
        heads = self.num_kv_heads * self.top_k
        if rotary is not None:
            q = rotary(op, q, position_ids, heads)
            k = rotary(op, k, position_ids, self.num_kv_heads)
        if slots is not None:
            past_key = place(op, past_key, k, slots, self.num_kv_heads, self.head_dim)
            past_value = place(op, past_value, v, slots, self.num_kv_heads, self.head_dim)
        attended, present_key, present_value = op.Attention(
            q,
            k,
            v,
            attention_bias,
            past_key,
            past_value,
            q_num_heads=heads,
            kv_num_heads=self.num_kv_heads,
            scale=self.scale,
            _outputs=3,
        )
        flat = op.Reshape(attended, op.Constant(value_ints=[-1, heads * self.head_dim]))
        out = op.Add(self._output(op, flat, picks, gates, outputs), bias)
        return op.Reshape(out, op.Shape(hidden_states)), present_key, present_value
