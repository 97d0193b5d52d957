"""Attention sinks (gpt_oss): a learned logit per head that joins every softmax row and is
dropped after it.

The softmax over [scores | sink], its sink column dropped, is the plain softmax times
Z / (Z + exp(sink)), Z the sum of exp(scores) of the row: so the output of a plain Attention
node times ``sigmoid(lse - sink)``, ``lse = log(Z)``. The scores are the Attention node's
``qk_matmul_output`` in mode 2 (scaled, softcapped and masked; masked keys hold the dtype's
lowest value, whose exp is 0), ``lse = max + log(sum(exp(scores - max)))`` computed in float32
(a model in another dtype casts the scores first and the factor back). onnxruntime's
GroupQueryAttention takes the same sinks as its ``head_sink`` input (optimize/rules/gqa.py).
"""

from __future__ import annotations

import onnx_ir as ir

from mobius_genai.ep.context import get_build_dtype

#: Attention's qk_matmul_output_mode whose output the sink factor reads: scores after the mask.
SCORES_MODE = 2


def apply_sinks(
    op, output: ir.Value, scores: ir.Value, sinks: ir.Value, num_heads: int, head_dim: int
) -> ir.Value:
    """`output` [b, s, heads * d] of attention with `scores` [b, heads, s, total] and `sinks`
    [heads] joined to each softmax (see the module docstring)."""
    widen = get_build_dtype() != ir.DataType.FLOAT
    if widen:
        scores = op.Cast(scores, to=ir.DataType.FLOAT)
        sinks = op.Cast(sinks, to=ir.DataType.FLOAT)
    axes = op.Constant(value_ints=[-1])
    top = op.ReduceMax(scores, axes, keepdims=1)
    total = op.ReduceSum(op.Exp(op.Sub(scores, top)), axes, keepdims=1)
    sink = op.Reshape(sinks, op.Constant(value_ints=[1, -1, 1, 1]))
    keep = op.Sigmoid(op.Sub(op.Add(top, op.Log(total)), sink))  # [b, heads, s, 1]
    keep = op.Transpose(keep, perm=[0, 2, 1, 3])
    if widen:
        keep = op.Cast(keep, to=get_build_dtype())
    heads = op.Reshape(output, op.Constant(value_ints=[0, 0, num_heads, head_dim]))
    return op.Reshape(op.Mul(heads, keep), op.Constant(value_ints=[0, 0, -1]))
