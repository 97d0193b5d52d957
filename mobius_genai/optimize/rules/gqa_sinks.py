"""GQASinkFusion: GQAFusion for attention with sinks → GroupQueryAttention with ``head_sink``.

components/sinks.py emits, after an Attention node over rotated q/k with the masks.py bias and
``qk_matmul_output_mode=2``::

    top = ReduceMax(scores, [-1]);  lse = top + Log(ReduceSum(Exp(scores - top), [-1]))
    out = Reshape(Reshape(attention, [0, 0, H, D]) * Transpose(Sigmoid(lse - Reshape(sinks,
          [1, -1, 1, 1])), [0, 2, 1, 3]), [0, 0, -1])

(with the scores and sinks cast to float32 and the factor back in a model of another dtype).
onnxruntime's GroupQueryAttention adds exp(head_sink[h]) to the denominator of each softmax
row of head h (input 11, ``head_sink`` [num_heads]; measured on the CPU kernel against the
softmax over [scores | sink] with its sink column dropped, tests/optimize/test_gqa_sinks.py).

Math preserved: the output and present key/values of the whole subgraph, under GQAFusion's
conditions (its checks run first and its reasons are reported), when the sinks are a [num_heads]
tensor and the reshapes split and merge the heads as above. The group runs only where the EP's
capabilities say its GQA kernel takes head_sink (``supports_gqa_head_sink``); elsewhere the
subgraph stays standard ONNX.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.optimize.rules.gqa import GQAFusion, rotated_attention, unrotated_attention

_SHAPES = {"sink_shape": [1, -1, 1, 1], "flat_shape": [0, 0, -1]}


def _ints(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    return [int(v) for v in np.asarray(value.const_value.numpy()).reshape(-1)]


class GQASinkFusion(GQAFusion):
    """Attention + the sink rescaling of components/sinks.py → GroupQueryAttention(head_sink)."""

    scores_mode = 2

    def __init__(self, widened: bool) -> None:
        super().__init__("GQASinkFusion" + ("Widened" if widened else ""))
        self.widened = widened
        self._sinks: ir.Value | None = None

    def pattern(
        self,
        op,
        query,
        key,
        value,
        mask,
        past_key,
        past_value,
        cos,
        sin,
        position_ids,
        sinks,
        sink_shape,
        head_shape,
        flat_shape,
    ):
        attention, present_key, present_value, scores = rotated_attention(
            op, query, key, value, mask, past_key, past_value, cos, sin, position_ids, scores=True
        )
        output = self._rescaled(op, attention, scores, sinks, sink_shape, head_shape, flat_shape)
        return output, present_key, present_value

    def _rescaled(self, op, attention, scores, sinks, sink_shape, head_shape, flat_shape):
        """The sink rescaling of components/sinks.py over the Attention's outputs."""
        if self.widened:
            scores = op.Cast(scores, to=ir.DataType.FLOAT)
            sinks = op.Cast(sinks, to=ir.DataType.FLOAT)
        top = op.ReduceMax(scores, [-1], keepdims=1)
        total = op.ReduceSum(op.Exp(op.Sub(scores, top)), [-1], keepdims=1)
        keep = op.Sigmoid(op.Sub(op.Add(top, op.Log(total)), op.Reshape(sinks, sink_shape)))
        keep = op.Transpose(keep, perm=[0, 2, 1, 3])
        if self.widened:
            keep = op.Cast(keep)
        heads = op.Reshape(attention, head_shape)
        return op.Reshape(op.Mul(heads, keep), flat_shape)

    def check(
        self, context, sinks, sink_shape, head_shape, flat_shape, **bindings
    ) -> pattern.MatchResult:
        result = super().check(context, **bindings)
        if not result:
            return result
        heads = self._attributes["num_heads"]
        if sinks.shape is None or list(sinks.shape) != [heads]:
            return result.fail(f"sinks are not a [{heads}] tensor", sinks)
        if sinks.dtype != bindings["query"].dtype:
            return result.fail("sinks and query differ in dtype (GQA takes one T)", sinks)
        for name, shape in (("sink_shape", sink_shape), ("flat_shape", flat_shape)):
            if _ints(shape) != _SHAPES[name]:
                return result.fail(f"{name} is not the constant {_SHAPES[name]}", shape)
        split = _ints(head_shape)
        if split is None or split[:3] != [0, 0, heads] or len(split) != 4:
            return result.fail(f"the output is not split into {heads} heads", head_shape)
        self._sinks = sinks
        return result

    def head_sink(self) -> ir.Value | None:
        """The matched sinks, GroupQueryAttention's head_sink."""
        return self._sinks


class GQASinkFusionNoRope(GQASinkFusion):
    """The same over unrotated q/k (a NoPE layer: granite_swa's rope base 0) →
    GroupQueryAttention(do_rotary=0, head_sink)."""

    do_rotary = False

    def __init__(self, widened: bool) -> None:
        super().__init__(widened)
        self.name = "GQASinkFusionNoRope" + ("Widened" if widened else "")

    def pattern(
        self,
        op,
        query,
        key,
        value,
        mask,
        past_key,
        past_value,
        sinks,
        sink_shape,
        head_shape,
        flat_shape,
    ):
        attention, present_key, present_value, scores = unrotated_attention(
            op, query, key, value, mask, past_key, past_value, scores=True
        )
        output = self._rescaled(op, attention, scores, sinks, sink_shape, head_shape, flat_shape)
        return output, present_key, present_value


def rules() -> pattern.RewriteRuleSet:
    """GQASinkFusion for float32 models and for models whose sinks are widened to float32, then
    its do_rotary=0 form for the layers without rotary."""
    return pattern.RewriteRuleSet(
        [
            GQASinkFusion.rule(False),
            GQASinkFusion.rule(True),
            GQASinkFusionNoRope.rule(False),
            GQASinkFusionNoRope.rule(True),
        ]
    )
