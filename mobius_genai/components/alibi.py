"""The ALiBi attention bias: masks.py's additive mask plus each head's slope times the key's
distance back from the query, [batch, heads, seq, total_seq].

    bias[b, h, i, j] = mask[b, 0, i, j] + slope_h · (pos[b, j] − pos[b, past + i])
    pos[b, j] = (ones of attention_mask[b] up to j) − 1

Positions come from the mask's ones, as Bloom's build_alibi_tensor counts them, so a row's
padding (left, or a hole of og.Generator's right-padded row) does not move its keys. Bloom adds
slope · pos[b, j] and MPT slope · (j − (total − 1)); both differ from the distance above by an
amount constant along a query's row, which softmax removes; the distance keeps the bias near 0
for the keys a query weighs most, so float16 holds it as well as it holds the scores. Masked
keys stay at the dtype's lowest value (Max), never past it.

The bias node carries ALIBI_KEY (why the causal GQA fusion declines) and the slopes
(ALIBI_SLOPES_KEY): GroupQueryAttention keeps each row's keys at the slots of their positions
(its shared buffer packs a right-padded row's new keys after its last real one), so the GQA
rule gives it `position_bias`, the same biases laid out by key position.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.ep.context import get_build_dtype

#: Metadata on the ALiBi bias node: what the causal GroupQueryAttention cannot express.
ALIBI_KEY = "mobius.alibi"
#: Metadata on the ALiBi bias node: its slopes, a JSON list, for `position_bias`.
ALIBI_SLOPES_KEY = "mobius.alibi_slopes"

_INT64_MAX = 2**63 - 1


def _positions(op, attention_mask: ir.Value, seq: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(each key slot's position [batch, total], each query's [batch, seq]: the last seq)."""
    one = op.Constant(value_int=1)
    positions = op.Sub(op.CumSum(attention_mask, one), one)
    queries = op.Slice(
        positions, op.Neg(seq), op.Constant(value_ints=[_INT64_MAX]), op.Constant(value_ints=[1])
    )
    return positions, queries


def _linear(op, keys: ir.Value, queries: ir.Value, slopes, like: ir.Value) -> ir.Value:
    """slope_h · (key − query), [batch, heads, seq, total] in `like`'s dtype, from key
    positions [batch or 1, total] and query positions [batch, seq]."""
    distance = op.Sub(
        op.Unsqueeze(keys, op.Constant(value_ints=[1, 2])),
        op.Unsqueeze(queries, op.Constant(value_ints=[1, 3])),
    )
    per_head = ir.tensor(np.asarray(slopes, dtype=np.float32).reshape(1, -1, 1, 1))
    linear = op.Mul(op.Cast(distance, to=ir.DataType.FLOAT), op.Constant(value=per_head))
    return op.CastLike(linear, like)


def _lowest(op, dtype: ir.DataType) -> ir.Value:
    lowest = ml_dtypes.finfo(dtype.numpy()).min
    return op.Constant(value=ir.tensor(np.array(lowest, dtype=dtype.numpy())))


def alibi_bias(
    op, mask: ir.Value, input_ids: ir.Value, attention_mask: ir.Value, slopes: np.ndarray
) -> ir.Value:
    """`mask` [batch, 1, seq, total] (masks.py) with the linear biases of `slopes` [heads]
    added."""
    positions, queries = _positions(op, attention_mask, op.Shape(input_ids, start=1, end=2))
    linear = _linear(op, positions, queries, slopes, mask)
    bias = op.Max(op.Add(mask, linear), _lowest(op, get_build_dtype()))
    bias.producer().metadata_props[ALIBI_KEY] = "linear biases by key position (ALiBi)"
    bias.producer().metadata_props[ALIBI_SLOPES_KEY] = json.dumps([float(s) for s in slopes])
    return bias


def position_bias(op, alibi: ir.Value, attention_mask: ir.Value, query: ir.Value) -> ir.Value:
    """The biases of `alibi` (an `alibi_bias`) laid out by key position: key slot p holds the
    key at position p, seen by query i when p <= its position; [batch, heads, seq, total] for
    `query` [batch, seq, hidden]."""
    slopes = json.loads(alibi.producer().metadata_props[ALIBI_SLOPES_KEY])
    _, queries = _positions(op, attention_mask, op.Shape(query, start=1, end=2))
    total = op.Squeeze(op.Shape(attention_mask, start=1, end=2), op.Constant(value_ints=[0]))
    keys = op.Unsqueeze(
        op.Range(op.Constant(value_int=0), total, op.Constant(value_int=1)),
        op.Constant(value_ints=[0]),
    )  # [1, total]
    seen = op.LessOrEqual(
        op.Unsqueeze(keys, op.Constant(value_ints=[1, 2])),
        op.Unsqueeze(queries, op.Constant(value_ints=[1, 3])),
    )  # [batch, 1, seq, total]
    linear = _linear(op, keys, queries, slopes, alibi)
    return op.Where(seen, linear, _lowest(op, alibi.dtype))
