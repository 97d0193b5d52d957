"""The ALiBi attention bias: masks.py's additive mask plus each head's slope times the key's
distance back from the query, [batch, heads, seq, total_seq].

    bias[b, h, i, j] = mask[b, 0, i, j] + slope_h · (pos[b, j] − pos[b, past + i])
    pos[b, j] = (ones of attention_mask[b] up to j) − 1

Positions come from the mask's ones, as Bloom's build_alibi_tensor counts them, so a row's
padding (left, or a hole of og.Generator's right-padded row) does not move its keys. Bloom adds
slope · pos[b, j] and MPT slope · (j − (total − 1)); both differ from the distance above by an
amount constant along a query's row, which softmax removes; the distance keeps the bias near 0
for the keys a query weighs most, so float16 holds it as well as it holds the scores. Masked
keys stay at the dtype's lowest value (Max), never past it. The bias node carries ALIBI_KEY so
the GQA rules say why the plain fusion declined and GQAImageBlockFusion passes the bias on as
GroupQueryAttention's attention_bias.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.ep.context import get_build_dtype

#: Metadata on the ALiBi bias node: what the causal GroupQueryAttention cannot express.
ALIBI_KEY = "mobius.alibi"

_INT64_MAX = 2**63 - 1


def alibi_bias(
    op, mask: ir.Value, input_ids: ir.Value, attention_mask: ir.Value, slopes: np.ndarray
) -> ir.Value:
    """`mask` [batch, 1, seq, total] (masks.py) with the linear biases of `slopes` [heads]
    added."""
    one = op.Constant(value_int=1)
    positions = op.Sub(op.CumSum(attention_mask, one), one)  # [batch, total]
    seq = op.Shape(input_ids, start=1, end=2)
    queries = op.Slice(
        positions, op.Neg(seq), op.Constant(value_ints=[_INT64_MAX]), op.Constant(value_ints=[1])
    )  # [batch, seq]: the positions of the last seq slots
    distance = op.Sub(
        op.Unsqueeze(positions, op.Constant(value_ints=[1, 2])),
        op.Unsqueeze(queries, op.Constant(value_ints=[1, 3])),
    )  # [batch, 1, seq, total]
    per_head = ir.tensor(np.asarray(slopes, dtype=np.float32).reshape(1, -1, 1, 1))
    linear = op.Mul(op.Cast(distance, to=ir.DataType.FLOAT), op.Constant(value=per_head))
    dtype = get_build_dtype()
    lowest = ml_dtypes.finfo(dtype.numpy()).min
    bias = op.Max(
        op.Add(mask, op.CastLike(linear, mask)),
        op.Constant(value=ir.tensor(np.array(lowest, dtype=dtype.numpy()))),
    )
    bias.producer().metadata_props[ALIBI_KEY] = "linear biases by key position (ALiBi)"
    return bias
