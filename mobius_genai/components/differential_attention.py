"""Differential attention (DiffLlama): two attention maps per pair of query heads, the second
scaled by a learned lambda and subtracted from the first (config/differential.py).

transformers' DiffLlamaAttention attends twice with the same q and k, over the first half of
the value heads and over the second half (each repeated to the full kv head count), and joins
the two outputs of each query head side by side [2 * head_dim]. With H query heads, kv value
heads V_g and g(h) the group of head h, that is, for the first H / 2 heads,
A_h = [P_h V_g(h) | P_h V_g(h)+kv/2], and for the others A_h = [P_h V_g(h)-kv/2 | P_h V_g(h)]
(P_h head h's softmax map). So two Attention nodes give every product: the layer's own over
(q, k, v) with its cache, O1_h = P_h V_g(h), and a second one over that node's present keys
and values, the value heads' halves swapped, O2_h = P_h V_swap(g(h)), with the same mask. An
EP with a fused attention op takes the first as one (GroupQueryAttention on cpu); the second,
which has no cache of its own, stays standard Attention, so the bundle's caches grow by
concatenation (no shared past/present buffer: bundle/graph.py's `shares_kv_buffer`). Then,
for j < H / 2 and lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init,

    D_j = A_j - lambda * A_j+H/2 = [O1_j - lambda * O2_j+H/2 | O2_j - lambda * O1_j+H/2]

normalized by a weightless RMSNorm over its 2 * head_dim channels (the head norm, "subln"),
times 1 - lambda_init, the H / 2 pairs flattened back to H * head_dim for o_proj.
"""

from __future__ import annotations

import onnx_ir as ir

from mobius_genai.components.attention import Attention
from mobius_genai.components.linear import parameter
from mobius_genai.components.norms import RMSNorm
from mobius_genai.config import ArchitectureConfig


class DifferentialAttention(Attention):
    """DiffLlama's attention of one layer: Attention's projections, rotary and cache, the
    differential combination of two attention calls (module docstring)."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__(config, layer_index)
        section = config.differential_attention
        self.lambda_init = section.lambda_init(layer_index)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, parameter([self.head_dim]))
        eps = config.norm_eps
        self.head_norm = (
            RMSNorm(2 * self.head_dim, eps, affine=False) if section.head_norm else None
        )

    def attend(
        self, op, q, k, v, attention_bias, past_key, past_value, attributes
    ) -> tuple[ir.Value, ...]:
        own, present_key, present_value = super().attend(
            op, q, k, v, attention_bias, past_key, past_value, attributes
        )
        # every key and value the first call attended over: its present cache
        width = self.num_kv_heads * self.head_dim
        keys = _flat_heads(op, present_key, width)
        swapped, *_ = super().attend(
            op,
            q,
            keys,
            _flat_heads(op, _swap_halves(op, present_value), width),
            attention_bias,
            None,
            None,
            attributes,
        )
        return self._difference(op, own, swapped), present_key, present_value

    def _lambda(self, op, like: ir.Value) -> ir.Value:
        """exp(sum(q1 * k1)) - exp(sum(q2 * k2)) + lambda_init, a scalar, in float32 first."""
        exps = []
        for q, k in ((self.lambda_q1, self.lambda_k1), (self.lambda_q2, self.lambda_k2)):
            wide = (op.Cast(value, to=ir.DataType.FLOAT) for value in (q, k))
            exps.append(op.Exp(op.ReduceSum(op.Mul(*wide), keepdims=0)))
        full = op.Add(op.Sub(*exps), op.Constant(value_float=self.lambda_init))
        return op.CastLike(full, like)

    def _difference(self, op, own: ir.Value, swapped: ir.Value) -> ir.Value:
        """[b, s, H * d] outputs of both calls → the normed, scaled differences [b, s, H * d]."""
        halves = op.Constant(value_ints=[0, 0, 2, self.num_heads // 2, self.head_dim])
        first1, second1 = op.Split(op.Reshape(own, halves), num_outputs=2, axis=2, _outputs=2)
        first2, second2 = op.Split(op.Reshape(swapped, halves), num_outputs=2, axis=2, _outputs=2)
        lam = self._lambda(op, own)
        left = op.Sub(first1, op.Mul(lam, second2))
        right = op.Sub(first2, op.Mul(lam, second1))
        pairs = op.Concat(left, right, axis=-1)  # [b, s, 1, H / 2, 2d]
        if self.head_norm is not None:
            pairs = self.head_norm(op, pairs)
        scale = op.CastLike(op.Constant(value_float=1.0 - self.lambda_init), own)
        return op.Reshape(op.Mul(pairs, scale), op.Constant(value_ints=[0, 0, -1]))


def _swap_halves(op, cache: ir.Value) -> ir.Value:
    """`cache` [b, kv, t, d] with its two halves of kv heads swapped."""
    first, second = op.Split(cache, num_outputs=2, axis=1, _outputs=2)
    return op.Concat(second, first, axis=1)


def _flat_heads(op, cache: ir.Value, width: int) -> ir.Value:
    """[b, kv, t, d] → [b, t, kv * d = width], the layout Attention takes keys and values in."""
    flat = op.Constant(value_ints=[0, 0, width])
    return op.Reshape(op.Transpose(cache, perm=[0, 2, 1, 3]), flat)
