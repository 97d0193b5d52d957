"""EP-aware optimization: the four-stage pipeline, its rules, Tier-1 functions and the trace.

`optimize_model(model, ep, dtype, model_role, trace)` rewrites a portable model in place for
one execution provider and returns an `OptimizationReport` (rule → matches, nodes added and
removed, decline reasons, the trace lines).
"""

from mobius_genai.optimize.gates import FUSIONS, LOWERINGS
from mobius_genai.optimize.pipeline import optimize_model
from mobius_genai.optimize.trace import Decline, OptimizationReport, RuleStats, trace_to_stderr

__all__ = [
    "FUSIONS",
    "LOWERINGS",
    "Decline",
    "OptimizationReport",
    "RuleStats",
    "optimize_model",
    "trace_to_stderr",
]
