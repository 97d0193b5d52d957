"""The additive attention bias [batch, 1, seq, total_seq] from the 2-D attention_mask.

Key j is visible to query i (absolute position past + i) when it is not padding, not in the
future, and, for sliding-window layers, fewer than `window` positions back (the convention
transformers uses: i - j < window). With `position_ids` the distance is counted in positions:
the query's own and the key's (ones of the mask up to it, minus one), which is the slot
distance for a row without holes, and the prompt's own distance for a row with them: a
right-padded row of og.Generator's batch continues after its padding, and og.Engine's shorter
rows (components/kv_slots.py) keep their keys below later slots. A chunked layer (Llama 4's
local attention) sees only the keys of the query's own chunk: key and query positions in the
same `chunk`-sized block, counted as the window's distance is; its bias node carries
CHUNKED_KEY so the GQA rule can say why it declined (GQA's window is not a chunk).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.ep.context import get_build_dtype

#: Metadata on the bias node of a chunked layer: what GroupQueryAttention cannot express.
CHUNKED_KEY = "mobius.chunked_attention"


def attention_bias(
    op,
    input_ids: ir.Value,
    attention_mask: ir.Value,
    window: int | None,
    position_ids: ir.Value | None = None,
    chunk: int | None = None,
) -> ir.Value:
    """0 where attention is allowed, the dtype's lowest value where it is not (windows and
    chunks in `position_ids` [batch, seq] when given, else in slots)."""
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
    if window is not None or chunk is not None:
        latest, keys = query_pos, key_pos
        if position_ids is not None:
            latest = op.Unsqueeze(position_ids, op.Constant(value_ints=[1, 3]))
            counted = op.CumSum(attention_mask, op.Constant(value_int=1))
            keys = op.Unsqueeze(
                op.Sub(counted, op.Constant(value_int=1)), op.Constant(value_ints=[1, 2])
            )
    if window is not None:
        allowed = op.And(allowed, op.Greater(keys, op.Sub(latest, op.Constant(value_int=window))))
    if chunk is not None:  # padding keys (position -1) are masked above whatever their chunk
        size = op.Constant(value_int=chunk)
        allowed = op.And(allowed, op.Equal(op.Div(keys, size), op.Div(latest, size)))
    dtype = get_build_dtype()
    lowest = ml_dtypes.finfo(dtype.numpy()).min
    bias = op.Where(
        allowed,
        op.Constant(value=ir.tensor(np.array(0, dtype=dtype.numpy()))),
        op.Constant(value=ir.tensor(np.array(lowest, dtype=dtype.numpy()))),
    )
    if chunk is not None:
        bias.producer().metadata_props[CHUNKED_KEY] = (
            f"keys of the query's own {chunk}-position chunk only"
        )
    return bias
