"""SimplifiedNorm: ONNX RMSNormalization (opset 23) → onnxruntime's SimplifiedLayerNormalization.

Math preserved: both compute ``x / sqrt(mean(x², over axes [axis, rank)) + epsilon) * scale``
with the statistics in float (``stash_type=1``), so the rule carries ``axis`` and ``epsilon``
over and declines any other ``stash_type``. SimplifiedLayerNormalization is the op onnxruntime
registers in the ONNX domain (since version 1) and the one onnxruntime-genai's builder emits;
an EP without a kernel for the opset-23 op (``supports_rms_normalization=False``, DirectML) has
one for it. Its optional outputs are left out; an RMSNormalization has none.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from mobius_genai.optimize.declines import RecordingRuleClassBase

#: RMSNormalization's defaults (opset 23).
_AXIS, _EPSILON, _FLOAT_STASH = -1, 1e-5, 1


class SimplifiedNorm(RecordingRuleClassBase):
    """RMSNormalization(x, scale) → SimplifiedLayerNormalization(x, scale), same axis/epsilon."""

    def __init__(self) -> None:
        super().__init__("SimplifiedNorm")

    def pattern(self, op, x, scale):
        return op.RMSNormalization(x, scale, _allow_other_attributes=True, _outputs=["normalized"])

    def check(self, context, x, scale, normalized, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        node = normalized.producer()
        if node.attributes.get_int("stash_type", _FLOAT_STASH) != _FLOAT_STASH:
            return result.fail("stash_type is not float (SimplifiedLayerNormalization's)", node)
        return result

    def rewrite(self, op, x, scale, normalized, **_):
        node = normalized.producer()
        return op.SimplifiedLayerNormalization(
            x,
            scale,
            axis=node.attributes.get_int("axis", _AXIS),
            epsilon=node.attributes.get_float("epsilon", _EPSILON),
        )


def rules() -> pattern.RewriteRuleSet:
    """The SimplifiedNorm rule."""
    return pattern.RewriteRuleSet([SimplifiedNorm.rule()])
