"""SkipLayerNorm: Add + LayerNormalization → com.microsoft::SkipLayerNormalization.

Math preserved::

    s = input + skip
    y = (s - mean(s)) / sqrt(var(s) + epsilon) * gamma + beta      (over the last axis)
    SkipLayerNormalization(input, skip, gamma[, beta], epsilon) → (y, _, _, s)

Output 0 replaces the norm and output 3 (``input_skip_bias_sum``) the sum, which other nodes
(the residual path) may keep reading. A LayerNormalization without bias maps to the op without
``beta``. Declines on the same conditions as SkipNorm (see skip_norm.py). A norm whose
Mean / InvStdDev outputs are read does not match at all (the matched nodes must be removable).
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules.skip_norm import check_skip_operands

__all__ = ["SkipLayerNormFusion", "rules"]

RULE_NAME = "SkipLayerNorm"
_ONNX_LAYER_NORM_EPSILON = 1e-5  # LayerNormalization's default when the attribute is absent


class SkipLayerNormFusion(RecordingRuleClassBase):
    """Add(input, skip) → LayerNormalization(sum, gamma, beta), keeping the sum."""

    def __init__(self) -> None:
        super().__init__(RULE_NAME)

    def pattern(self, op, x, skip, gamma):
        total = op.Add(x, skip)
        beta = pattern.Var("beta", can_match_none=True)  # LayerNormalization's optional bias
        normalized = op.LayerNormalization(total, gamma, beta, _outputs=["normalized"])
        return normalized, total

    def check(self, context, x, skip, gamma, normalized, beta=None, **_) -> pattern.MatchResult:
        return check_skip_operands(normalized.producer(), x, skip, gamma, beta)

    def rewrite(self, op, x, skip, gamma, normalized, beta=None, **_):
        epsilon = normalized.producer().attributes.get_float("epsilon", _ONNX_LAYER_NORM_EPSILON)
        inputs = [x, skip, gamma] if beta is None else [x, skip, gamma, beta]
        output, _mean, _inv_std_var, total = op.SkipLayerNormalization(
            *inputs, epsilon=epsilon, _domain=MS_DOMAIN, _outputs=4
        )
        return output, total


def rules() -> pattern.RewriteRuleSet:
    """The SkipLayerNorm rule set."""
    return pattern.RewriteRuleSet([SkipLayerNormFusion.rule()])
