"""Where each new token's key and value land in a KV cache that grows by concatenation.

onnxruntime-genai 0.18 feeds such a cache (ONNX Attention, `past_present_share_buffer: false`)
in two ways (og.Engine's measured by echoing its inputs, tests/runtime/test_og_feeds.py;
og.Generator's as its source builds them, kept by tests/runtime/test_og_contract.py's batches):

- og.Generator: each row's new tokens follow the whole past (slot past + j); padding stays in
  the cache, hidden by zeros in `attention_mask`.
- og.Engine (a static batch of requests of different lengths in one cache): row b's
  `attention_mask` is ones over its own length L_b and zeros after it, `position_ids` number
  its tokens from its processed length (padding: 0), and the present cache is bound
  [batch, kv, T, head] with T = the mask's length, the longest row's (which stops growing once
  that request has finished, while the past is still T long). Each row is kept
  contiguous, as in GroupQueryAttention's shared buffer: a shorter row's new token belongs at
  slot position_ids, not after the longest row's past.

`kv_slots` picks one slot per new token, S of them after a past cut to K = T - S slots (the
Attention op appends the new tokens after it): the token's concatenated slot K + j when the mask
shows it, else its position p when 0 < p < K (og.Engine's shorter rows), else K + j (padding,
which the mask hides). og.Generator's feeds always give K + j, so its cache is the
concatenation, unchanged. `place` writes the tokens whose slot is below K into the past
Attention reads, cut to K slots so that the present is T long, the length og binds.
"""

from __future__ import annotations

from typing import NamedTuple

import onnx_ir as ir

#: Metadata on the node that yields a placed past: GroupQueryAttention, whose shared buffer
#: places tokens by itself, reads the past before placement (`unplaced`).
PLACED_PAST_KEY = "mobius.placed_past"


class Slots(NamedTuple):
    """The new tokens' slots [batch, seq] (int64), the kept past length K [1], and the batch
    and seq sizes [1] (read from input_ids: EliminateShapePass counts a 2-D input's dims)."""

    slots: ir.Value
    kept: ir.Value
    batch: ir.Value
    seq: ir.Value


def kv_slots(op, input_ids: ir.Value, attention_mask: ir.Value, position_ids: ir.Value) -> Slots:
    """Where each new token's key and value land, as above."""
    seq = op.Shape(input_ids, start=1, end=2)
    kept = op.Sub(op.Shape(attention_mask, start=1, end=2), seq)
    zero = op.Constant(value_int=0)
    concatenated = op.Add(
        op.Range(zero, op.Squeeze(seq), op.Constant(value_int=1)), op.Squeeze(kept)
    )
    shown = op.Cast(op.Gather(attention_mask, concatenated, axis=1), to=ir.DataType.BOOL)
    inside = op.And(op.Greater(position_ids, zero), op.Less(position_ids, kept))
    moved = op.And(op.Not(shown), inside)
    slots = op.Where(moved, position_ids, op.Unsqueeze(concatenated, zero))
    return Slots(slots, kept, op.Shape(input_ids, start=0, end=1), seq)


def place(op, past: ir.Value, new: ir.Value, slots: Slots, heads: int, head_dim: int) -> ir.Value:
    """`past` [batch, heads, P, head_dim] cut to K slots, with each token of `new` [batch, seq,
    heads * head_dim] whose slot is below K written there (the others land in slots K + j of
    the past and new keys concatenated, which the cut drops: K <= P)."""
    two = op.Constant(value_ints=[2])
    new = op.Transpose(
        op.Reshape(new, op.Constant(value_ints=[0, 0, heads, head_dim])), perm=[0, 2, 1, 3]
    )
    sizes = [slots.batch, op.Constant(value_ints=[heads]), slots.seq]
    sizes = op.Concat(*sizes, op.Constant(value_ints=[head_dim]), axis=0)
    indices = op.Expand(op.Unsqueeze(slots.slots, op.Constant(value_ints=[1, 3])), sizes)
    written = op.ScatterElements(op.Concat(past, new, axis=2), indices, new, axis=2)
    placed = op.Slice(written, op.Constant(value_ints=[0]), slots.kept, two)
    placed.producer().metadata_props[PLACED_PAST_KEY] = "1"
    return placed


def unplaced(value: ir.Value) -> ir.Value:
    """The past `place` read when `value` is its output, else `value` itself."""
    node = value.producer()
    if node is None or PLACED_PAST_KEY not in node.metadata_props:
        return value
    concat = node.inputs[0].producer().inputs[0].producer()  # Slice ← ScatterElements ← Concat
    return concat.inputs[0]
