"""The additive attention bias [batch, 1, seq, total_seq] from the 2-D attention_mask.

Key j is visible to query i (absolute position past + i) when it is not padding, not in the
future, and, for sliding-window layers, fewer than `window` slots back from the query's own
slot (the convention transformers uses: i - j < window). The query's slot is where its key
lands (components/kv_slots.py): past + i for og.Generator, the row's own position for a shorter
row of og.Engine's batch, whose later slots the padding mask hides but whose window it does not.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.ep.context import get_build_dtype


def attention_bias(
    op,
    input_ids: ir.Value,
    attention_mask: ir.Value,
    window: int | None,
    slots: ir.Value | None = None,
) -> ir.Value:
    """0 where attention is allowed, the dtype's lowest value where it is not (`slots`
    [batch, seq]: the queries' slots, kv_slots.py; None: past + i)."""
    seq = op.Shape(input_ids, start=1, end=2)
    total = op.Shape(attention_mask, start=1, end=2)
    zero = op.Constant(value_ints=[0])
    start = op.Squeeze(op.Sub(total, seq), zero)
    end = op.Squeeze(total, zero)
    step = op.Constant(value_int=1)
    query_pos = op.Unsqueeze(op.Range(start, end, step), op.Constant(value_ints=[1]))
    key_pos = op.Unsqueeze(op.Range(op.Constant(value_int=0), end, step), zero)
    not_padding = op.Cast(
        op.Unsqueeze(attention_mask, op.Constant(value_ints=[1, 2])), to=ir.DataType.BOOL
    )
    allowed = op.And(op.Unsqueeze(op.LessOrEqual(key_pos, query_pos), zero), not_padding)
    if window is not None:
        latest = query_pos if slots is None else op.Unsqueeze(slots, op.Constant(value_ints=[1, 3]))
        allowed = op.And(
            allowed, op.Greater(key_pos, op.Sub(latest, op.Constant(value_int=window)))
        )
    dtype = get_build_dtype()
    lowest = ml_dtypes.finfo(dtype.numpy()).min
    return op.Where(
        allowed,
        op.Constant(value=ir.tensor(np.array(0, dtype=dtype.numpy()))),
        op.Constant(value=ir.tensor(np.array(lowest, dtype=dtype.numpy()))),
    )
