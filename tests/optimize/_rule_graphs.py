"""Test-only helpers for the non-attention rules: small graphs written in ONNX text, ORT runs.

``parse`` turns ONNX's textual syntax into an ir.Model (so each test shows the graph it
rewrites), ``rewrite`` applies one rule set the way the pipeline does (then registers Tier-1
bodies and drops dead nodes), ``run`` executes a model on the ORT CPU EP and ``random_feeds``
makes seeded inputs for every graph input; ``decline_reasons`` lists why checks refused.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import RemoveUnusedNodesPass
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchingTracer, MatchStatus

from mobius_genai.optimize.functions import register_functions

HEADER = '<ir_version: 10, opset_import: ["" : 24]>'


def parse(graph_text: str, header: str = HEADER) -> ir.Model:
    """An ir.Model from the ONNX text syntax (`header` sets IR version and opsets)."""
    return ir.from_proto(onnx.parser.parse_model(header + "\n" + graph_text))


def rewrite(model: ir.Model, rules: pattern.RewriteRuleSet) -> int:
    """Apply `rules`, register Tier-1 bodies, drop dead nodes; returns the number of rewrites."""
    count = rules.apply_to_model(model)
    register_functions(model)
    RemoveUnusedNodesPass()(model)
    return count


def clone(model: ir.Model) -> ir.Model:
    return ir.from_proto(ir.to_proto(model))


def ops(model: ir.Model) -> collections.Counter[str]:
    """op_type → nodes in the main graph."""
    return collections.Counter(node.op_type for node in model.graph)


def random_feeds(model: ir.Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded normal values for every (statically shaped) graph input."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.inputs:
        shape = [int(d) for d in value.shape]
        feeds[value.name] = rng.standard_normal(shape).astype(value.dtype.numpy())
    return feeds


def session(model: ir.Model) -> ort.InferenceSession:
    """An ORT CPU session (graph optimizations off, so ORT runs the graph as written)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    proto = ir.to_proto(model).SerializeToString()
    return ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])


def run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """All graph outputs of `model` on the ORT CPU EP."""
    return session(model).run(None, feeds)


class _ReasonCollector(MatchingTracer):
    """Keeps every failed check (MatchingTracer itself keeps only each rule's best match)."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def log(self, rule, container, node, match_result, status) -> None:
        if status == MatchStatus.CONDITION_FAILED:
            self.reasons.append(str(match_result.reason))


def decline_reasons(model: ir.Model, rules: pattern.RewriteRuleSet) -> list[str]:
    """The reasons the rules' checks gave for refusing candidates (on a copy of `model`)."""
    collector = _ReasonCollector()
    rules.apply_to_model(clone(model), tracer=collector)
    return collector.reasons
