"""Rewrite rules of the optimization pipeline, one module per rule group.

A rule module exposes ``rules() -> onnxscript.rewriter.pattern.RewriteRuleSet`` (or, for an
op-elimination pass, an ``onnx_ir.passes.InPlacePass`` class); the pipeline decides from the EP's
capabilities whether it runs (mobius_genai/optimize/gates.py). Rule classes derive from
``RecordingRuleClassBase`` (mobius_genai/optimize/declines.py) and decline a candidate with
``MatchResult.fail(reason)``; the pipeline records the reasons and the trace prints them.

This module holds the small shape helpers the rules share.
"""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["describe", "opset_version", "same_dim", "same_shape"]


def same_dim(a: int | ir.SymbolicDim, b: int | ir.SymbolicDim) -> bool:
    """Dimensions provably equal: the same int, or the same named symbol (unknown never is)."""
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a.value is not None and a.value == b.value


def same_shape(a: ir.Value | None, b: ir.Value | None) -> bool:
    """Shapes of `a` and `b` known and provably equal, dimension by dimension."""
    if a is None or b is None or a.shape is None or b.shape is None:
        return False
    if a.shape.rank() != b.shape.rank():
        return False
    return all(same_dim(x, y) for x, y in zip(a.shape, b.shape, strict=True))


def opset_version(model: ir.Model, domain: str = "") -> int | None:
    """The opset `model` imports for `domain` ("" also accepts "ai.onnx")."""
    version = model.opset_imports.get(domain)
    if version is None and domain == "":
        version = model.opset_imports.get("ai.onnx")
    return version


def describe(value: ir.Value | None) -> str:
    """`name` with its shape, for decline messages."""
    if value is None:
        return "<none>"
    shape = "?" if value.shape is None else str(list(value.shape))
    return f"{value.name} {shape}"
