"""The ALiBi attention bias: masks.py's additive mask plus each head's slope times the key's
distance back from the query, [batch, heads, seq, total_seq].

    bias[b, h, i, j] = mask[b, 0, i, j] + slope_h · (pos[b, j] − pos[b, past + i])
    pos[b, j] = (ones of attention_mask[b] up to j) − 1

Positions come from the mask's ones, as Bloom's build_alibi_tensor counts them, so a row's
padding (left, or a hole of og.Generator's right-padded row) does not move its keys. Bloom adds
slope · pos[b, j] and MPT slope · (j − (total − 1)); both differ from the distance above by an
amount constant along a query's row, which softmax removes; the distance keeps the bias near 0
for the keys a query weighs most, so float16 holds it as well as it holds the scores. Falcon
rounds slope · pos[b, j] to bfloat16 (config/alibi.py): its bias is by key position alone, as
transformers makes it. Masked keys stay at the dtype's lowest value (Max), never past it.

The bias node carries ALIBI_KEY (why the causal GQA fusion declines) and its settings
(ALIBI_SETTINGS_KEY): GroupQueryAttention keeps each row's keys at the slots of their positions
(its shared buffer packs a right-padded row's new keys after its last real one), so the GQA
rule gives it `position_bias`, the same biases laid out by key position.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.config.alibi import Alibi
from mobius_genai.ep.context import get_build_dtype

#: Metadata on the ALiBi bias node: what the causal GroupQueryAttention cannot express.
ALIBI_KEY = "mobius.alibi"
#: Metadata on the ALiBi bias node: its slopes, rounding and factor (JSON), for
#: `position_bias`.
ALIBI_SETTINGS_KEY = "mobius.alibi_settings"

_INT64_MAX = 2**63 - 1


def _positions(op, attention_mask: ir.Value, seq: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(each key slot's position [batch, total], each query's [batch, seq]: the last seq)."""
    one = op.Constant(value_int=1)
    positions = op.Sub(op.CumSum(attention_mask, one), one)
    queries = op.Slice(
        positions, op.Neg(seq), op.Constant(value_ints=[_INT64_MAX]), op.Constant(value_ints=[1])
    )
    return positions, queries


def _linear(op, keys: ir.Value, queries: ir.Value, settings: dict, like: ir.Value) -> ir.Value:
    """The biases in `like`'s dtype, from key positions [batch or 1, total] and query
    positions [batch, seq]: slope_h · (key − query) [batch, heads, seq, total], or with
    bfloat16 rounding bf16(slope_h · key) [batch or 1, heads, 1, total]; times the factor."""
    per_head = np.asarray(settings["slopes"], dtype=np.float32).reshape(1, -1, 1, 1)
    slopes = op.Constant(value=ir.tensor(per_head))
    keys = op.Unsqueeze(keys, op.Constant(value_ints=[1, 2]))
    if settings["bfloat16"]:
        product = op.Mul(op.Cast(keys, to=ir.DataType.FLOAT), slopes)  # exact in float32
        linear = op.Cast(op.Cast(product, to=ir.DataType.BFLOAT16), to=ir.DataType.FLOAT)
    else:
        distance = op.Sub(keys, op.Unsqueeze(queries, op.Constant(value_ints=[1, 3])))
        linear = op.Mul(op.Cast(distance, to=ir.DataType.FLOAT), slopes)
    if settings["factor"] != 1.0:
        linear = op.Mul(linear, op.Constant(value_float=settings["factor"]))
    return op.CastLike(linear, like)


def _lowest(op, dtype: ir.DataType) -> ir.Value:
    lowest = ml_dtypes.finfo(dtype.numpy()).min
    return op.Constant(value=ir.tensor(np.array(lowest, dtype=dtype.numpy())))


def alibi_bias(
    op,
    mask: ir.Value,
    input_ids: ir.Value,
    attention_mask: ir.Value,
    alibi: Alibi,
    num_heads: int,
    scale: float,
) -> ir.Value:
    """`mask` [batch, 1, seq, total] (masks.py) with the linear biases of `alibi`'s slopes
    for `num_heads` heads added (times `scale`, the scores', where `alibi.scaled`)."""
    slopes = [float(s) for s in alibi.slopes(num_heads)]
    if alibi.bfloat16:
        slopes = [float(ml_dtypes.bfloat16(s)) for s in slopes]
    settings = {"slopes": slopes, "bfloat16": alibi.bfloat16, "factor": 1.0}
    if alibi.scaled:
        settings["factor"] = scale
    positions, queries = _positions(op, attention_mask, op.Shape(input_ids, start=1, end=2))
    linear = _linear(op, positions, queries, settings, mask)
    bias = op.Max(op.Add(mask, linear), _lowest(op, get_build_dtype()))
    bias.producer().metadata_props[ALIBI_KEY] = "linear biases by key position (ALiBi)"
    bias.producer().metadata_props[ALIBI_SETTINGS_KEY] = json.dumps(settings)
    return bias


def position_bias(op, alibi: ir.Value, attention_mask: ir.Value, query: ir.Value) -> ir.Value:
    """The biases of `alibi` (an `alibi_bias`) laid out by key position: key slot p holds the
    key at position p, seen by query i when p <= its position; [batch, heads, seq, total] for
    `query` [batch, seq, hidden]."""
    settings = json.loads(alibi.producer().metadata_props[ALIBI_SETTINGS_KEY])
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
    linear = _linear(op, keys, queries, settings, alibi)
    return op.Where(seen, linear, _lowest(op, alibi.dtype))
