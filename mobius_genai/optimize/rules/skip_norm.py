"""SkipNorm: Add + RMSNormalization → com.microsoft::SkipSimplifiedLayerNormalization.

Math preserved::

    s = input + skip
    y = s / sqrt(mean(s², axis=-1) + epsilon) * gamma
    SkipSimplifiedLayerNormalization(input, skip, gamma, epsilon) → (y, _, _, s)

Output 0 replaces the norm and output 3 (``input_skip_bias_sum``) replaces the sum, so the
residual path that also reads the sum keeps working. In a pre-norm decoder this fires twice per
layer: the attention residual feeding ``post_attention_layernorm`` (intra-layer) and the MLP
residual feeding the next layer's ``input_layernorm`` or the final norm (cross-layer). The first
layer's input norm reads the embedding directly, so an N-layer decoder gets 2N fusions.

Declines when the two summands do not have provably equal shapes of rank 2 or 3 (the op does not
broadcast like Add), when gamma is not one vector of the hidden size, when the norm is not over
the last axis or computes in another precision (``stash_type`` other than float32), or when
the dtypes differ.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules import describe, same_dim, same_shape

__all__ = ["SkipRMSNormFusion", "check_skip_operands", "rules"]

RULE_NAME = "SkipNorm"
_ONNX_RMS_EPSILON = 1e-5  # RMSNormalization's default when the attribute is absent


def check_skip_operands(
    norm_node: ir.Node, x: ir.Value, skip: ir.Value, gamma: ir.Value, beta: ir.Value | None = None
) -> pattern.MatchResult:
    """Conditions shared by SkipNorm and SkipLayerNorm, as a MatchResult with the reason."""
    result = pattern.MatchResult()
    if not same_shape(x, skip):
        return result.fail(
            f"summands {describe(x)} and {describe(skip)} do not have provably equal shapes",
            [x, skip],
        )
    rank = x.shape.rank()
    if rank not in (2, 3):
        return result.fail(f"summands have rank {rank}; the fused op takes rank 2 or 3", x)
    axis = norm_node.attributes.get_int("axis", -1)
    if axis not in (-1, rank - 1):
        return result.fail(f"{norm_node.op_type} axis={axis} is not the last axis", norm_node)
    stash_type = norm_node.attributes.get_int("stash_type", 1)
    if stash_type != ir.DataType.FLOAT:
        return result.fail(f"{norm_node.op_type} stash_type={stash_type} is not float32", norm_node)
    hidden = x.shape[-1]
    for name, vector in (("gamma", gamma), ("beta", beta)):
        if vector is None:
            continue
        if (
            vector.shape is None
            or vector.shape.rank() != 1
            or not same_dim(vector.shape[0], hidden)
        ):
            return result.fail(
                f"{name} {describe(vector)} is not one vector of the hidden size {hidden}", vector
            )
    dtypes = {v.dtype for v in (x, skip, gamma, beta) if v is not None}
    if None in dtypes or len(dtypes) != 1:
        return result.fail(f"operand dtypes differ or are unknown: {sorted(map(str, dtypes))}", x)
    return result


class SkipRMSNormFusion(RecordingRuleClassBase):
    """Add(input, skip) → RMSNormalization(sum, gamma), keeping the sum for its other readers."""

    def __init__(self) -> None:
        super().__init__(RULE_NAME)

    def pattern(self, op, x, skip, gamma):
        total = op.Add(x, skip)
        normalized = op.RMSNormalization(total, gamma, _outputs=["normalized"])
        return normalized, total

    def check(self, context, x, skip, gamma, normalized, **_) -> pattern.MatchResult:
        return check_skip_operands(normalized.producer(), x, skip, gamma)

    def rewrite(self, op, x, skip, gamma, normalized, **_):
        epsilon = normalized.producer().attributes.get_float("epsilon", _ONNX_RMS_EPSILON)
        output, _mean, _inv_std_var, total = op.SkipSimplifiedLayerNormalization(
            x, skip, gamma, epsilon=epsilon, _domain=MS_DOMAIN, _outputs=4
        )
        return output, total


def rules() -> pattern.RewriteRuleSet:
    """The SkipNorm rule set."""
    return pattern.RewriteRuleSet([SkipRMSNormFusion.rule()])
