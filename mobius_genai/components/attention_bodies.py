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
outputs are gathered back into packed order. The queries go through Attention in equal chunks
of at most `_QUERY_CHUNK` (a Scan over the chunks; softmax rows are independent, so this is
exact), so the scores take batch x heads x chunk x max_len, never heads x tokens²: windowed
attention over W windows of L tokens costs heads·W·L² (one chunk), full attention over P
tokens heads·`_QUERY_CHUNK`·P, where a block-diagonal bias over all the tokens costs P² for
the bias alone and heads·P² for the scores. The ``bias`` and ``attention_bias`` inputs are not
covered (nothing emits them).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["packed_multi_head_attention"]

_INT64_MAX = 2**63 - 1
#: The most queries one Attention of the body takes: a sequence longer than this (a whole
#: frame, for full attention) is attended in equal chunks of at most this many queries.
_QUERY_CHUNK = 1024


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
    """[batch, 1, 1, max_len] bool: key s of sequence b is one of its tokens
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
    return tape.op("Unsqueeze", [inside, _ints(tape, 1, 2)])


def _attention_step() -> ir.Graph:
    """Scan body: the keys, values [batch, heads, max_len, head_size] and key mask (state,
    passed on unchanged) and one chunk of queries [batch, heads, chunk, head_size] → its
    attention over every key of its sequence [batch, heads, chunk, v_head_size]."""
    tape = ir.tape.Tape()
    names = ("key_in", "value_in", "mask_in", "query_chunk")
    key, value, mask, queries = inputs = [ir.Value(name=name) for name in names]
    scale = ir.RefAttr("scale", "scale", ir.AttributeType.FLOAT)
    attended = tape.op("Attention", [queries, key, value, mask], {"scale": scale})
    passed = [tape.op("Identity", [x]) for x in (key, value, mask)]
    for x, name in zip(passed, ("key_out", "value_out", "mask_out"), strict=True):
        x.name = name
    attended.name = "attended_chunk"
    return ir.Graph(inputs, [*passed, attended], nodes=tape.nodes, name="packed_attention_chunk")


def _heads(tape: ir.tape.Tape, x: ir.Value) -> ir.Value:
    """[batch, max_len, heads · size] → [batch, heads, max_len, size]."""
    heads = tape.op(
        "Constant", [], {"value_int": ir.RefAttr("value_int", "num_heads", ir.AttributeType.INT)}
    )
    shape = tape.op(
        "Concat",
        [_ints(tape, 0, 0), tape.op("Reshape", [heads, _ints(tape, 1)]), _ints(tape, -1)],
        {"axis": 0},
    )
    return tape.op("Transpose", [tape.op("Reshape", [x, shape])], {"perm": [0, 2, 1, 3]})


def _chunked_attention(
    tape: ir.tape.Tape, q: ir.Value, k: ir.Value, v: ir.Value, keys: ir.Value, layout: ir.Value
) -> ir.Value:
    """Attention of padded q, k, v [batch, max_len, ...] under the key mask [batch, 1, 1,
    max_len], `_QUERY_CHUNK` queries at a time at most (equal chunks, the last rows padded):
    a Scan over the chunks, so the scores take batch x heads x chunk x max_len."""
    max_len = tape.op("Slice", [layout, _ints(tape, 1), _ints(tape, 2)])
    limit = _ints(tape, _QUERY_CHUNK)
    one = _ints(tape, 1)
    chunks = tape.op("Div", [tape.op("Sub", [tape.op("Add", [max_len, limit]), one]), limit])
    size = tape.op("Div", [tape.op("Sub", [tape.op("Add", [max_len, chunks]), one]), chunks])
    rows = tape.op("Mul", [chunks, size])
    # [begin, end] of each axis: the query rows padded at the end of axis 2
    ends = [_ints(tape, 0, 0, 0, 0, 0, 0), tape.op("Sub", [rows, max_len]), _ints(tape, 0)]
    q = tape.op("Pad", [_heads(tape, q), tape.op("Concat", ends, {"axis": 0})])
    split = tape.op("Concat", [_ints(tape, 0, 0), chunks, size, _ints(tape, -1)], {"axis": 0})
    scanned = tape.op(
        "Transpose", [tape.op("Reshape", [q, split])], {"perm": [2, 0, 1, 3, 4]}
    )  # [chunks, batch, heads, size, head_size]
    batch = tape.op("Slice", [layout, _ints(tape, 0), _ints(tape, 1)])
    mask = tape.op("Expand", [keys, tape.op("Concat", [batch, one, size, max_len], {"axis": 0})])
    step = ir.Attr("body", ir.AttributeType.GRAPH, _attention_step())
    *_, out = tape.op_multi_out(
        "Scan",
        [_heads(tape, k), _heads(tape, v), mask, scanned],
        {"body": step, "num_scan_inputs": 1},
        num_outputs=4,
    )  # [chunks, batch, heads, size, v_head_size]
    joined = tape.op(
        "Reshape",
        [
            tape.op("Transpose", [out], {"perm": [1, 0, 3, 2, 4]}),
            tape.op("Concat", [batch, rows, _ints(tape, -1)], {"axis": 0}),
        ],
    )
    return tape.op("Slice", [joined, _ints(tape, 0), max_len, one])  # [batch, max_len, v_hidden]


def packed_multi_head_attention(tape: ir.tape.Tape, params: Sequence[ir.Value]) -> list[ir.Value]:
    query, key, value, _bias, token_offset, cumulative, _attention_bias = params
    layout = tape.op("Shape", [token_offset])  # [batch, max_len]
    tokens = tape.op("Shape", [query], {"end": 1})
    flat = tape.op("Reshape", [token_offset, _ints(tape, -1)])
    real = tape.op(
        "Cast", [tape.op("Slice", [flat, _ints(tape, 0), tokens])], {"to": ir.DataType.INT64}
    )
    attended = _chunked_attention(
        tape,
        *(_padded(tape, x, real, layout) for x in (query, key, value)),
        _key_mask(tape, cumulative, layout),
        layout,
    )
    v_hidden = tape.op("Shape", [value], {"start": 1})
    rows = tape.op("Concat", [_ints(tape, -1), v_hidden], {"axis": 0})
    return [tape.op("Gather", [tape.op("Reshape", [attended, rows]), real], {"axis": 0})]
