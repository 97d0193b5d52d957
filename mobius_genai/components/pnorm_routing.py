"""DBRX's routing (config/moe.py `norm_p`) as a factor on a renormalizing MoE node's output.

transformers' DbrxFFN divides the top-k softmax probabilities w by their p-norm, not their
sum. A MoE node with normalize_routing_weights gives each picked expert w_i / sum(w); the
experts' outputs are summed linearly, so the node's output times sum(w) / ||w||_p is the sum
weighted by w_i / ||w||_p.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def pnorm_factor(op, x: ir.Value, logits: ir.Value, top_k: int, p: float) -> ir.Value:
    """sum(w) / ||w||_p of each token's `top_k` largest softmax probabilities of router
    `logits` [tokens, experts], shaped [batch, seq, 1] like `x`."""
    probabilities = op.Softmax(logits, axis=-1)
    top, _ = op.TopK(probabilities, op.Constant(value_ints=[top_k]), axis=-1, _outputs=2)
    last = op.Constant(value_ints=[-1])
    power = op.CastLike(op.Constant(value=ir.tensor(np.array(p, dtype=np.float32))), top)
    inverse = op.CastLike(op.Constant(value=ir.tensor(np.array(1 / p, dtype=np.float32))), top)
    norm = op.Pow(op.ReduceSum(op.Pow(top, power), last, keepdims=1), inverse)
    factor = op.Div(op.ReduceSum(top, last, keepdims=1), norm)
    rows = op.Concat(op.Shape(x, end=-1), op.Constant(value_ints=[1]), axis=0)
    return op.Reshape(factor, rows)
