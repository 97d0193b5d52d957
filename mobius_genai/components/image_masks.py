"""The additive attention bias of a decoder whose image tokens see each other (Gemma 3).

transformers gives the tokens of one image (a run of `image_token_id`s) bidirectional
attention among themselves during prefill: for full layers ``causal OR same_image``, for
sliding layers ``(causal OR same_image) AND i - j < window``, always AND not padding. The
graph reads the image runs from `input_ids`, so only the keys of the current call can be
image partners; keys cached by earlier calls are seen causally (onnxruntime-genai feeds a
whole prompt at once, and decode steps carry no image tokens).

Causal GroupQueryAttention cannot see later keys, so the causal GQA rule declines this bias
(the bias node carries BIDIRECTIONAL_BLOCKS_KEY, the reason, and BIDIRECTIONAL_WINDOW_KEY, its
window); where the EP's GQA takes an attention_bias, GQAImageBlockFusion hands it the whole
bias with ``causal=0`` (optimize/rules/gqa_image_blocks.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.ep.context import get_build_dtype

#: Metadata on the bias node: the reason attention cannot be causal-only.
BIDIRECTIONAL_BLOCKS_KEY = "mobius.bidirectional_blocks"
#: Metadata on the bias node: the sliding window it applies ("" for none).
BIDIRECTIONAL_WINDOW_KEY = "mobius.bidirectional_window"


def _image_runs(op, input_ids: ir.Value, image_token_id: int) -> ir.Value:
    """[batch, seq] int64: the index of the image run a token belongs to, -1 for text."""
    is_image = op.Equal(input_ids, op.Constant(value_int=image_token_id))
    as_int = op.Cast(is_image, to=ir.DataType.INT64)
    previous = op.Pad(
        op.Slice(
            as_int,
            op.Constant(value_ints=[0]),
            op.Constant(value_ints=[-1]),
            op.Constant(value_ints=[1]),
        ),
        op.Constant(value_ints=[0, 1, 0, 0]),
    )
    starts = op.Mul(as_int, op.Sub(op.Constant(value_int=1), previous))
    run = op.Sub(op.CumSum(starts, op.Constant(value_int=1)), op.Constant(value_int=1))
    return op.Where(is_image, run, op.Constant(value_int=-1))


def image_block_bias(
    op,
    input_ids: ir.Value,
    attention_mask: ir.Value,
    window: int | None,
    image_token_id: int,
) -> ir.Value:
    """[batch, 1, seq, total] bias: 0 where attention is allowed, the dtype's lowest elsewhere."""
    seq = op.Shape(input_ids, start=1, end=2)
    total = op.Shape(attention_mask, start=1, end=2)
    zero = op.Constant(value_ints=[0])
    past = op.Sub(total, seq)
    end = op.Squeeze(total, zero)
    step = op.Constant(value_int=1)
    query_pos = op.Unsqueeze(
        op.Range(op.Squeeze(past, zero), end, step), op.Constant(value_ints=[1])
    )
    key_pos = op.Unsqueeze(op.Range(op.Constant(value_int=0), end, step), zero)
    runs = _image_runs(op, input_ids, image_token_id)
    batch = op.Shape(input_ids, start=0, end=1)
    cached = op.ConstantOfShape(
        op.Concat(batch, past, axis=0),
        value=ir.tensor(np.array([-1], dtype=np.int64)),
    )
    key_runs = op.Concat(cached, runs, axis=1)  # [batch, total]
    query_runs = op.Unsqueeze(runs, op.Constant(value_ints=[2]))  # [batch, seq, 1]
    same_image = op.And(
        op.Equal(query_runs, op.Unsqueeze(key_runs, op.Constant(value_ints=[1]))),
        op.GreaterOrEqual(query_runs, op.Constant(value_int=0)),
    )
    allowed = op.Or(op.Unsqueeze(op.LessOrEqual(key_pos, query_pos), zero), same_image)
    if window is not None:
        inside = op.Greater(key_pos, op.Sub(query_pos, op.Constant(value_int=window)))
        allowed = op.And(allowed, op.Unsqueeze(inside, zero))
    not_padding = op.Cast(
        op.Unsqueeze(attention_mask, op.Constant(value_ints=[1, 2])), to=ir.DataType.BOOL
    )
    allowed = op.And(op.Unsqueeze(allowed, op.Constant(value_ints=[1])), not_padding)
    dtype = get_build_dtype()
    lowest = ml_dtypes.finfo(dtype.numpy()).min
    bias = op.Where(
        allowed,
        op.Constant(value=ir.tensor(np.array(0, dtype=dtype.numpy()))),
        op.Constant(value=ir.tensor(np.array(lowest, dtype=dtype.numpy()))),
    )
    metadata = bias.producer().metadata_props
    metadata[BIDIRECTIONAL_BLOCKS_KEY] = (
        f"tokens of one image (id {image_token_id}) attend to each other in both directions"
    )
    metadata[BIDIRECTIONAL_WINDOW_KEY] = "" if window is None else str(window)
    return bias
