"""PhiMoE's sparsemixer routing (config/moe.py `SparseMixer`) as router inputs of two MoE nodes.

onnxruntime 1.32's CPU MoE kernel ignores `use_sparse_mixer` (measured:
tests/models/families/test_phimoe.py), so the routing is computed in standard ops and handed to two
com.microsoft::MoE nodes with k=1 and no renormalization. Each node takes a softmax of its
router input and weights its top-1 expert by that probability, so a router input that holds a
pick's logits inside its band and -inf elsewhere makes the node compute exactly
`multiplier * expert(x)` for that pick; the two outputs add up to the sparsemixer's MoE.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.config.moe import SparseMixer


def _minus_infinity(op, like: ir.Value) -> ir.Value:
    return op.CastLike(op.Constant(value=ir.tensor(np.array(-np.inf, dtype=np.float32))), like)


def _band(op, scores: ir.Value, candidates: ir.Value, mixer: SparseMixer) -> ir.Value:
    """`candidates` with -inf where `(max - scores) / max(|scores|, max) > 2 * eps`, `max`
    being the largest of `candidates` (transformers computes the ratio on the unmasked scores)."""
    top = op.ReduceMax(candidates, op.Constant(value_ints=[-1]), keepdims=1)
    factor = op.Max(op.Abs(scores), top)
    ratio = op.Div(op.Sub(top, scores), factor)
    threshold = op.CastLike(op.Constant(value_float=2 * mixer.eps), scores)
    return op.Where(op.Greater(ratio, threshold), _minus_infinity(op, scores), candidates)


def first_pick(op, scores: ir.Value, mixer: SparseMixer) -> ir.Value:
    """Router input [tokens, experts] of the first pick: the largest logit and its band."""
    return _band(op, scores, scores, mixer)


def second_pick(op, scores: ir.Value, mixer: SparseMixer) -> ir.Value:
    """Router input of the second pick: the first pick (the first largest logit, as torch's
    max) masked out, then the band around the largest remaining logit."""
    first = op.ArgMax(scores, axis=-1, keepdims=1)
    masked = op.ScatterElements(
        scores, first, op.Expand(_minus_infinity(op, scores), op.Shape(first)), axis=-1
    )
    return _band(op, scores, masked, mixer)
