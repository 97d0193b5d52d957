"""Padding and recurrent states: what a recurrent block does with the attention mask.

A state must hold what the real tokens of a row left in it, wherever that row's padding is:
on the left (transformers' batches) or on the right (onnxruntime-genai 0.18 pads a batch of
prompts on the right and feeds the mask with zeros there). So padded positions are zeroed on the
way in (as transformers does), a gated delta rule neither decays nor updates its state there, and
a conv state is cut after each row's last real token instead of after the call's last column.
"""

from __future__ import annotations

import onnx_ir as ir


def current_mask(op, hidden_states: ir.Value, attention_mask: ir.Value) -> ir.Value:
    """The mask columns of this call's tokens, [batch, seq] (int64, 1 for a real token).

    A Slice with a computed start has unknown dims for onnx's shape inference, and every
    broadcast after it would spread them to the block's output; the Reshape to the hidden
    states' own [batch, seq] (a no-op) gives them back, so the residual Add after the block
    still fuses with its norm (optimize/rules/skip_norm.py needs provably equal shapes)."""
    sizes = op.Shape(hidden_states, end=2)  # [batch, seq]
    # the last `batch` rows (all of them) and the last `seq` columns
    columns = op.Slice(attention_mask, op.Neg(sizes), op.Constant(value_ints=[2**63 - 1] * 2))
    return op.Reshape(columns, sizes)


def zero_padding(op, hidden_states: ir.Value, current: ir.Value) -> ir.Value:
    """`hidden_states` [batch, seq, hidden] with the padded positions zeroed."""
    keep = op.CastLike(op.Unsqueeze(current, op.Constant(value_ints=[2])), hidden_states)
    return op.Mul(hidden_states, keep)


def real_tokens(op, current: ir.Value) -> ir.Value:
    """[batch, seq, 1] float32, 1 for a real token and 0 for padding: a recurrent gate times it
    neither decays nor updates the state at padded positions."""
    return op.Cast(op.Unsqueeze(current, op.Constant(value_ints=[2])), to=ir.DataType.FLOAT)


def state_after_last_token(op, window: ir.Value, current: ir.Value, columns: int) -> ir.Value:
    """The `columns` columns of `window` = [past state | input] ([batch, channels, columns +
    seq]) that follow each row's last real token: the state that token leaves (the past state
    for a row with no real token in this call)."""
    seq = op.Shape(current, start=1, end=2)
    one = op.Constant(value_int=1)
    counts = op.Range(one, op.Add(op.Squeeze(seq), one), one)  # 1..seq
    ends = op.ReduceMax(op.Mul(current, counts), op.Constant(value_ints=[1]), keepdims=1)
    offsets = op.Constant(value_ints=list(range(columns)))
    starts = op.Unsqueeze(op.Add(ends, offsets), op.Constant(value_ints=[1]))  # [batch, 1, cols]
    shape = op.Concat(op.Shape(window, end=2), op.Constant(value_ints=[columns]), axis=0)
    return op.GatherElements(window, op.Expand(starts, shape), axis=2)
