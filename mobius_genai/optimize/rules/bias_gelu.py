"""BiasGelu: Add(x, bias) + Gelu → com.microsoft::BiasGelu or FastGelu.

Math preserved::

    Gelu(x + bias)                        → BiasGelu(x, bias)
    Gelu(x + bias, approximate="tanh")    → FastGelu(x, bias)

onnxruntime's ``BiasGelu`` is the exact (erf) GELU of ``A + B``, and its tanh approximation
with a bias is ``FastGelu(X, bias)`` (contrib-op schemas and CPU kernels of onnxruntime 1.32,
checked numerically in tests/optimize/test_bias_gelu.py). So the erf form becomes BiasGelu and
the tanh form (gelu_new / gelu_fast / gelu_pytorch_tanh checkpoints) FastGelu; both carry the
same rule name. It matches FC MLPs with a biased first projection (GPT-2, Phi, Falcon style);
gated SiLU MLPs have no Gelu.

Declines when the bias is not one vector the length of x's last dimension (both kernels add it
along the last axis only) or when the dtypes differ.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules import describe, same_dim

__all__ = ["BiasGeluFusion", "rules"]

RULE_NAME = "BiasGelu"
_FUSED_OP = {"none": "BiasGelu", "tanh": "FastGelu"}


class BiasGeluFusion(RecordingRuleClassBase):
    """Gelu(Add(x, bias)) with a 1-D bias → BiasGelu (erf) / FastGelu (tanh)."""

    def __init__(self, bias_first: bool) -> None:
        super().__init__(RULE_NAME)
        self.bias_first = bias_first

    def pattern(self, op, x, bias):
        added = op.Add(bias, x) if self.bias_first else op.Add(x, bias)
        return op.Gelu(added, _outputs=["gelu"])

    def check(self, context, x, bias, gelu, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        approximate = gelu.producer().attributes.get_string("approximate", "none")
        if approximate not in _FUSED_OP:
            return result.fail(f"Gelu approximate={approximate!r} has no fused op", gelu)
        if bias.shape is None or bias.shape.rank() != 1:
            return result.fail(f"bias {describe(bias)} is not a vector", bias)
        if x.shape is None or x.shape.rank() < 1 or not same_dim(x.shape[-1], bias.shape[0]):
            return result.fail(
                f"bias {describe(bias)} does not match the last dimension of {describe(x)}", x
            )
        if x.dtype is None or x.dtype != bias.dtype:
            return result.fail(f"dtypes differ or are unknown: {x.dtype} vs {bias.dtype}", x)
        return result

    def rewrite(self, op, x, bias, gelu, **_):
        approximate = gelu.producer().attributes.get_string("approximate", "none")
        return op.op(_FUSED_OP[approximate], x, bias, _domain=MS_DOMAIN)


def rules() -> pattern.RewriteRuleSet:
    """The BiasGelu rule, for either operand order of the Add."""
    return pattern.RewriteRuleSet([BiasGeluFusion.rule(False), BiasGeluFusion.rule(True)])
