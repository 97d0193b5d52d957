"""The standard-ONNX body of com.microsoft::PackedMultiHeadAttention (a Tier-1 op, tier1.py).

onnxruntime's op (contrib-op schema in bert_defs.cc; its kernel is CUDA's,
contrib_ops/cuda/bert/packed_multihead_attention.cc): ``query``, ``key`` and ``value``
[tokens, hidden] hold `batch` sequences one after another, without padding;
``cumulative_sequence_length`` [batch + 1] (int32) is where each one starts, and
``token_offset`` [batch, max_len] (int32) where each token sits in the padded
[batch, max_len] layout: the real tokens' positions in packed order, then the padding
positions (onnxruntime's GetPaddingOffset convention). Each token attends to the tokens of its
own sequence only, with ``num_heads`` heads and ``scale`` (1/sqrt(head_size) when not given).

The body is the kernel's unfused path: the tokens are scattered into the padded layout,
standard Attention runs on each sequence with the keys past its length masked off, and the
outputs are gathered back into packed order. Its scores take batch x heads x max_len², not
heads x tokens²: windowed attention over W windows of L tokens costs W·L² where a
block-diagonal bias over all the tokens costs (W·L)², and needs no [tokens, tokens] bias.
The ``bias`` and ``attention_bias`` inputs are not covered (nothing emits them).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["packed_multi_head_attention"]

_INT64_MAX = 2**63 - 1


def _ints(tape: ir.tape.Tape, *values: int) -> ir.Value:
    return tape.op("Constant", [], {"value_ints": list(values)})


def _padded(tape: ir.tape.Tape, x: ir.Value, real: ir.Value, layout: ir.Value) -> ir.Value:
    """[tokens, hidden] → [batch, max_len, hidden]: token i at flat position real[i], zeros at
    the padding positions."""
    hidden = tape.op("Shape", [x], {"start": 1})
    rows = tape.op("ReduceProd", [layout], {"keepdims": 1})
    zero = tape.op("CastLike", [tape.op("Constant", [], {"value_float": 0.0}), x])
    zeros = tape.op("Expand", [zero, tape.op("Concat", [rows, hidden], {"axis": 0})])
    scattered = tape.op("ScatterND", [zeros, tape.op("Unsqueeze", [real, _ints(tape, 1)]), x])
    return tape.op("Reshape", [scattered, tape.op("Concat", [layout, hidden], {"axis": 0})])


def _key_mask(tape: ir.tape.Tape, cumulative: ir.Value, layout: ir.Value) -> ir.Value:
    """[batch, 1, max_len, max_len] bool: key s of sequence b is one of its tokens
    (s < cumulative[b + 1] - cumulative[b])."""
    ends = tape.op("Slice", [cumulative, _ints(tape, 1), _ints(tape, _INT64_MAX)])
    starts = tape.op("Slice", [cumulative, _ints(tape, 0), _ints(tape, -1)])
    lengths = tape.op("Cast", [tape.op("Sub", [ends, starts])], {"to": ir.DataType.INT64})
    max_len = tape.op("Slice", [layout, _ints(tape, 1), _ints(tape, 2)])
    zero = tape.op("Constant", [], {"value_int": 0})
    one = tape.op("Constant", [], {"value_int": 1})
    slots = tape.op("Range", [zero, tape.op("Squeeze", [max_len]), one])
    inside = tape.op(
        "Less",
        [
            tape.op("Unsqueeze", [slots, _ints(tape, 0)]),
            tape.op("Unsqueeze", [lengths, _ints(tape, 1)]),
        ],
    )  # [batch, max_len]
    every_query = tape.op("Concat", [layout, max_len], {"axis": 0})  # [batch, max_len, max_len]
    keys = tape.op("Expand", [tape.op("Unsqueeze", [inside, _ints(tape, 1)]), every_query])
    return tape.op("Unsqueeze", [keys, _ints(tape, 1)])


def packed_multi_head_attention(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    query, key, value, _bias, token_offset, cumulative, _attention_bias = params
    layout = tape.op("Shape", [token_offset])  # [batch, max_len]
    tokens = tape.op("Shape", [query], {"end": 1})
    flat = tape.op("Reshape", [token_offset, _ints(tape, -1)])
    real = tape.op(
        "Cast", [tape.op("Slice", [flat, _ints(tape, 0), tokens])], {"to": ir.DataType.INT64}
    )
    attended = tape.op(
        "Attention",
        [
            _padded(tape, query, real, layout),
            _padded(tape, key, real, layout),
            _padded(tape, value, real, layout),
            _key_mask(tape, cumulative, layout),
        ],
        {
            "q_num_heads": ir.RefAttr("q_num_heads", "num_heads", ir.AttributeType.INT),
            "kv_num_heads": ir.RefAttr("kv_num_heads", "num_heads", ir.AttributeType.INT),
            "scale": ir.RefAttr("scale", "scale", ir.AttributeType.FLOAT),
        },
    )  # [batch, max_len, v_hidden]
    v_hidden = tape.op("Shape", [value], {"start": 1})
    rows = tape.op("Concat", [_ints(tape, -1), v_hidden], {"axis": 0})
    return [tape.op("Gather", [tape.op("Reshape", [attended, rows]), real], {"axis": 0})]
