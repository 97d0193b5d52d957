"""FusedMatMul: MatMul with a transposed 2-D operand → com.microsoft::FusedMatMul.

Math preserved::

    MatMul(x, Transpose(w, perm=[1, 0]))  →  FusedMatMul(x, w, transB=1)
    MatMul(Transpose(w, perm=[1, 0]), y)  →  FusedMatMul(w, y, transA=1)

The case that matters is the tied LM head, ``logits = h @ embed_table.T``: the kernel reads the
shared embedding table transposed, so neither the graph nor onnxruntime's constant folding
materializes a second, transposed copy of it. The fused node uses the overload ``"transB"`` /
``"transA"`` whose standard body (functions.py) is exactly the Transpose + MatMul it replaces.

Declines when the transposed operand is not 2-D (the bodies are 2-D transposes), when the other
operand is not at least 2-D, when the dtype has no FusedMatMul kernel (float types only), and
when the model's IR version is below 10 (function overloads need IR 10).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules import describe

__all__ = ["TransposeMatMulFusion", "rules"]

RULE_NAME = "FusedMatMul"
OVERLOAD_IR_VERSION = 10
_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)


def _rank(value: ir.Value) -> int | None:
    return None if value.shape is None else value.shape.rank()


class TransposeMatMulFusion(RecordingRuleClassBase):
    """MatMul whose operand `side` ("A" or "B") is a Transpose of a 2-D tensor."""

    def __init__(self, side: str) -> None:
        super().__init__(RULE_NAME)
        self.side = side

    def pattern(self, op, x, y):
        if self.side == "A":
            return op.MatMul(op.Transpose(x, _outputs=["transposed"]), y)
        return op.MatMul(x, op.Transpose(y, _outputs=["transposed"]))

    def check(self, context, x, y, transposed, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if context.model.ir_version is not None and context.model.ir_version < OVERLOAD_IR_VERSION:
            return result.fail(
                f"model IR version {context.model.ir_version} < {OVERLOAD_IR_VERSION}: "
                "the FusedMatMul body needs a function overload"
            )
        operand, other = (x, y) if self.side == "A" else (y, x)
        perm = transposed.producer().attributes.get_ints("perm")
        if _rank(operand) != 2 or (perm is not None and list(perm) != [1, 0]):
            return result.fail(
                f"transposed operand {describe(operand)} (perm={perm}) is not a 2-D transpose",
                operand,
            )
        if _rank(other) is None or _rank(other) < 2:
            return result.fail(f"other operand {describe(other)} is not known to be >= 2-D", other)
        if operand.dtype not in _FLOAT_TYPES or other.dtype != operand.dtype:
            return result.fail(
                f"dtypes {operand.dtype} / {other.dtype} have no FusedMatMul kernel", operand
            )
        return result

    def rewrite(self, op, x, y, **_):
        attribute = f"trans{self.side}"
        output = op.FusedMatMul(x, y, _domain=MS_DOMAIN, **{attribute: 1})
        output.producer().overload = attribute
        return output


def rules() -> pattern.RewriteRuleSet:
    """FusedMatMul for a transposed first or second operand."""
    return pattern.RewriteRuleSet(
        [TransposeMatMulFusion.rule("A"), TransposeMatMulFusion.rule("B")]
    )
