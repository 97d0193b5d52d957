"""Llama 4's routing (config/moe.py `scaled_input`) as the inputs of one MoE node per pick.

transformers' Llama4TextMoe multiplies each token by sigmoid(router logit) before the expert
runs, so the score cannot be the MoE node's output weight (the expert is not linear). Pick j's
node gets the token times its score and a router input that is 0 at the picked expert and -inf
elsewhere: the node's softmax gives that expert weight 1, so the node computes
expert_j(sigmoid(logit_j) * x). The outputs of the `top_k` nodes add up to the routed sum.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def _constant(op, value: float, like: ir.Value) -> ir.Value:
    return op.CastLike(op.Constant(value=ir.tensor(np.array(value, dtype=np.float32))), like)


def picks(op, x: ir.Value, logits: ir.Value, top_k: int) -> list[tuple[ir.Value, ir.Value]]:
    """For each of the `top_k` picks: (the token's scale, [batch, seq, 1] like `x`; the router
    input [tokens, experts] of a k=1 MoE node), from router `logits` [tokens, experts]."""
    values, indices = op.TopK(logits, op.Constant(value_ints=[top_k]), axis=-1, _outputs=2)
    rows = op.Concat(op.Shape(x, end=-1), op.Constant(value_ints=[1]), axis=0)
    none = op.Expand(_constant(op, -np.inf, logits), op.Shape(logits))
    result = []
    for j in range(top_k):
        column = op.Constant(value_ints=[j])
        value = op.Gather(values, column, axis=-1)  # [tokens, 1]
        index = op.Gather(indices, column, axis=-1)
        zero = op.Expand(_constant(op, 0.0, logits), op.Shape(index))
        router = op.ScatterElements(none, index, zero, axis=-1)
        result.append((op.Reshape(op.Sigmoid(value), rows), router))
    return result
