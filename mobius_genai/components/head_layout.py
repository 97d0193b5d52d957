"""A layer's stored key/value heads widened to the cache's layout (config/head_layout.py):
values scaled and padded with zeros to the key head size, key/value heads repeated in a row;
the attention output's padded channels sliced off before o_proj."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.config.head_layout import HeadLayout


def _heads(op, x: ir.Value, heads: int, size: int) -> ir.Value:
    return op.Reshape(x, op.Constant(value_ints=[0, 0, heads, size]))


def _flat(op, x: ir.Value) -> ir.Value:
    return op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))


def _repeated(op, x: ir.Value, stored: int, repeats: int, head_dim: int) -> ir.Value:
    """[b, s, stored * d] → [b, s, stored * repeats * d], each head `repeats` times in a row."""
    per_head = op.Reshape(x, op.Constant(value_ints=[0, 0, stored, 1, head_dim]))
    return _flat(op, op.Expand(per_head, op.Constant(value_ints=[1, 1, 1, repeats, 1])))


def widen_key_values(
    op, k: ir.Value, v: ir.Value, layout: HeadLayout, stored: int, kv_heads: int, head_dim: int
) -> tuple[ir.Value, ir.Value]:
    """k [b, s, stored * head_dim] and v [b, s, stored * v_head_dim] as the cache holds them:
    [b, s, kv_heads * head_dim] each, v scaled and zero-padded."""
    if layout.value_scale != 1.0:
        scale = ir.tensor(np.array(layout.value_scale, dtype=np.float32))
        v = op.Mul(v, op.CastLike(op.Constant(value=scale), v))
    pad = head_dim - layout.v_head_dim
    if pad:
        pads = op.Constant(value_ints=[0, 0, 0, 0, 0, 0, 0, pad])
        v = _flat(op, op.Pad(_heads(op, v, stored, layout.v_head_dim), pads))
    repeats = kv_heads // stored
    if repeats > 1:
        k = _repeated(op, k, stored, repeats, head_dim)
        v = _repeated(op, v, stored, repeats, head_dim)
    return k, v


def narrowed_output(
    op, output: ir.Value, layout: HeadLayout, heads: int, head_dim: int
) -> ir.Value:
    """[b, s, heads * head_dim] → [b, s, heads * v_head_dim]: each head's padded channels
    (zeros) dropped."""
    if layout.v_head_dim == head_dim:
        return output
    kept = op.Slice(
        _heads(op, output, heads, head_dim),
        op.Constant(value_ints=[0]),
        op.Constant(value_ints=[layout.v_head_dim]),
        op.Constant(value_ints=[-1]),
    )
    return _flat(op, kept)
