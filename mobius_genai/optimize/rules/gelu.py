"""GeluFusion: decomposed GELU chains → the standard ONNX ``Gelu`` (opset 20).

Math preserved::

    0.5 · x · (1 + erf(x / √2))                               → Gelu(x)
    0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))        → Gelu(x, approximate="tanh")

Matched arrangements: the 0.5 applied to x first, to (1 + ...) first or last; ``x / √2`` or
``x · (1/√2)``; ``x³`` as ``Pow(x, 3)`` or ``(x · x) · x``; either operand order of every Add
and Mul. Constants must be one-element tensors (any rank) within a relative 4e-3 of the GELU
constant, so float16/bfloat16 graphs, whose constants are rounded, match too. The matcher only
ever reads one-element tensors: a weight where a constant belongs is refused by its size,
without loading it.

Declines when the model's ONNX opset is older than 20 (no ``Gelu``) or x is not a float tensor.
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules import opset_version

__all__ = ["GeluErfFusion", "GeluTanhFusion", "rules"]

RULE_NAME = "GeluFusion"
GELU_OPSET = 20
REL_TOL = 4e-3
_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
# Where the 0.5 goes: (x·0.5)·c, x·(0.5·c), (x·c)·0.5; c = 1 + erf(...) or 1 + tanh(...).
LAYOUTS = ("half_x", "half_cdf", "half_last")


def _constant(value: float) -> pattern.Constant:
    return pattern.Constant(value, rel_tol=REL_TOL, abs_tol=0.0)


class OneElementConstantMatcher(pattern.SimplePatternMatcher):
    """SimplePatternMatcher whose Constant patterns match one-element tensors of any rank.

    The stock matcher converts any tensor in a constant position to numpy (which would load a
    lazy weight) and accepts only rank 0; this one refuses by size first. onnxscript has no
    public hook for constant positions: this overrides SimplePatternMatcher._match_constant
    (onnxscript 0.7, the line pyproject.toml admits; tests/optimize/test_gelu.py notices a
    change).
    """

    def _match_constant(self, pattern_constant: pattern.Constant, value: ir.Value) -> bool:
        tensor = value.const_value
        if tensor is None or tensor.size != 1:
            return self.fail(f"{value.name} is not a one-element constant")
        found = float(tensor.numpy().reshape(()))
        if not math.isclose(found, pattern_constant.value, rel_tol=REL_TOL):
            return self.fail(f"{value.name} is {found}, expected {pattern_constant.value}")
        return True


def _either(op, op_type: str, a, b):
    """`op_type(a, b)` in either operand order (Add and Mul commute)."""
    build = getattr(op, op_type)
    return pattern.OrValue([build(a, b), build(b, a)])


def _combine(op, layout: str, mirrored: bool, x, cdf):
    """The final Mul with the 0.5 placed per `layout`; `mirrored` swaps the root's operands."""
    half = _constant(0.5)
    if layout == "half_x":
        first, second = _either(op, "Mul", x, half), cdf
    elif layout == "half_cdf":
        first, second = x, _either(op, "Mul", half, cdf)
    else:
        first, second = _either(op, "Mul", x, cdf), half
    return op.Mul(second, first) if mirrored else op.Mul(first, second)


class _GeluFusionBase(RecordingRuleClassBase):
    """Shared check and rewrite; subclasses give the pattern."""

    approximate = "none"
    matcher = OneElementConstantMatcher

    def __init__(self, name: str, layout: str, mirrored: bool) -> None:
        super().__init__(name)
        self.layout = layout
        self.mirrored = mirrored

    def check(self, context, x, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        version = opset_version(context.model)
        if version is None or version < GELU_OPSET:
            return result.fail(f"model opset {version} has no Gelu (needs {GELU_OPSET})")
        if x.dtype not in _FLOAT_TYPES:
            return result.fail(f"{x.name} has dtype {x.dtype}, not a float type", x)
        return result

    def rewrite(self, op, x, **_):
        if self.approximate == "none":
            return op.Gelu(x)
        return op.Gelu(x, approximate=self.approximate)


class GeluErfFusion(_GeluFusionBase):
    """0.5 · x · (1 + erf(x / √2)) → Gelu(x)."""

    def __init__(self, layout: str, mirrored: bool, divide: bool) -> None:
        super().__init__(f"{RULE_NAME}Erf", layout, mirrored)
        self.divide = divide

    def pattern(self, op, x):
        if self.divide:
            scaled = op.Div(x, _constant(math.sqrt(2.0)))
        else:
            scaled = _either(op, "Mul", x, _constant(1.0 / math.sqrt(2.0)))
        cdf = _either(op, "Add", op.Erf(scaled), _constant(1.0))
        return _combine(op, self.layout, self.mirrored, x, cdf)


class GeluTanhFusion(_GeluFusionBase):
    """0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))) → Gelu(x, approximate="tanh")."""

    approximate = "tanh"

    def __init__(self, layout: str, mirrored: bool, power: bool) -> None:
        super().__init__(f"{RULE_NAME}Tanh", layout, mirrored)
        self.power = power

    def pattern(self, op, x):
        cube = op.Pow(x, _constant(3.0)) if self.power else _either(op, "Mul", op.Mul(x, x), x)
        inner = _either(op, "Add", x, _either(op, "Mul", _constant(0.044715), cube))
        scaled = _either(op, "Mul", _constant(math.sqrt(2.0 / math.pi)), inner)
        cdf = _either(op, "Add", op.Tanh(scaled), _constant(1.0))
        return _combine(op, self.layout, self.mirrored, x, cdf)


def rules() -> pattern.RewriteRuleSet:
    """Every arrangement of both GELU forms.

    Operand orders are alternatives inside each pattern (OrValue) rather than one rule per
    order: ``commute=True`` would make over a thousand rules, each tried at every Mul.
    """
    variants = [(layout, mirrored) for layout in LAYOUTS for mirrored in (False, True)]
    rules = [GeluErfFusion.rule(*v, divide) for v in variants for divide in (True, False)]
    rules += [GeluTanhFusion.rule(*v, power) for v in variants for power in (True, False)]
    return pattern.RewriteRuleSet(rules)
