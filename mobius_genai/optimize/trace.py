"""What the optimization pipeline did: the report it returns and the trace it logs.

The pipeline records the same facts whether or not tracing is on (so the graph cannot depend on
it); ``trace=True`` only sends the lines to the ``mobius_genai.optimize`` logger at INFO, e.g.::

    [EP Trace] Target: cuda, dtype: FLOAT16, role: decoder
    [EP Trace] Stage 1: Cleanup (7 passes)
    [EP Trace]   Cleanup: 90 → 84 nodes (-6)
    [EP Trace] Stage 2: Fusion (7 rule groups)
    [EP Trace]   SkipNorm                  : +6 SkipSimplifiedLayerNormalization, -6 Add, ...
    [EP Trace]   GeluFusion                : no matches (0 nodes affected)
    ...
    [EP Trace] Summary:
    [EP Trace]   Rule                      | Matched | +Nodes | -Nodes
    [EP Trace]   --------------------------+---------+--------+-------
    [EP Trace]   SkipNorm                  |       6 |      6 |     12
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

import onnx_ir as ir

__all__ = [
    "LOGGER_NAME",
    "PREFIX",
    "Decline",
    "OptimizationReport",
    "RuleStats",
    "StageStats",
    "Tracer",
    "count_difference",
    "op_counts",
    "trace_to_stderr",
]

LOGGER_NAME = "mobius_genai.optimize"
PREFIX = "[EP Trace]"
NAME_WIDTH = 26
MAX_DECLINES_SHOWN = 5

logger = logging.getLogger(LOGGER_NAME)

_UNQUALIFIED_DOMAINS = ("", "ai.onnx", "com.microsoft")


def _op_label(node: ir.Node) -> str:
    """The op type; domain-qualified outside the standard and com.microsoft domains."""
    if node.domain in _UNQUALIFIED_DOMAINS:
        return node.op_type
    return f"{node.domain}::{node.op_type}"


def op_counts(model: ir.Model) -> collections.Counter[str]:
    """Nodes of the main graph (and its subgraphs) by op type."""
    return collections.Counter(_op_label(node) for node in model.graph.all_nodes())


@dataclasses.dataclass(frozen=True)
class Decline:
    """A candidate a rule matched structurally but refused, and why (its check() reason)."""

    rule: str
    node: str
    op_type: str
    reason: str

    def __str__(self) -> str:
        if self.node:
            return f"declined at node {self.node!r} ({self.op_type}): {self.reason}"
        if self.op_type:
            return f"declined at an unnamed {self.op_type} node: {self.reason}"
        return f"declined: {self.reason}"


@dataclasses.dataclass
class RuleStats:
    """What one rule group (or InlinePass) did to the graph."""

    name: str
    stage: str
    matched: int = 0
    """Rewrites applied (for a pass: nodes it removed)."""
    added: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    removed: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    declines: list[Decline] = dataclasses.field(default_factory=list)
    kept: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Ops a group keeps as they are for the EP's kernel (FusedMoEPass)."""

    @property
    def nodes_added(self) -> int:
        return sum(self.added.values())

    @property
    def nodes_removed(self) -> int:
        return sum(self.removed.values())

    def effect(self) -> str:
        """'+6 SkipSimplifiedLayerNormalization, -6 Add, ...', 'kept 2 MoE (...)' or
        'no matches (...)'."""
        if self.kept and not self.added and not self.removed:
            kept = ", ".join(f"{n} {op}" for op, n in _ordered(self.kept))
            return f"kept {kept} (the EP's fused kernel)"
        if not self.added and not self.removed:
            return "no matches (0 nodes affected)"
        parts = [f"+{n} {op}" for op, n in _ordered(self.added)]
        parts += [f"-{n} {op}" for op, n in _ordered(self.removed)]
        return ", ".join(parts)


def _ordered(counts: collections.Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def count_difference(
    before: collections.Counter[str], after: collections.Counter[str]
) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """(added, removed) op counts between two snapshots."""
    return after - before, before - after


@dataclasses.dataclass(frozen=True)
class StageStats:
    """Node count of the main graph before and after one stage."""

    name: str
    nodes_before: int
    nodes_after: int


@dataclasses.dataclass
class OptimizationReport:
    """The outcome of `optimize_model` on one model.

    ``matches`` (rule → number of rewrites) lists every rule group that ran for the target,
    including those that matched nothing; ``fired`` only those that changed the graph.
    """

    ep: str
    dtype: ir.DataType
    role: str
    rules: dict[str, RuleStats] = dataclasses.field(default_factory=dict)
    stages: list[StageStats] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    """Rule groups that did not run for this target → the capability that kept them out."""
    """Rule groups the target calls for whose module is not installed."""
    warnings: list[str] = dataclasses.field(default_factory=list)
    trace_lines: list[str] = dataclasses.field(default_factory=list)
    """The trace, whether or not it was logged."""

    @property
    def matches(self) -> dict[str, int]:
        return {name: stats.matched for name, stats in self.rules.items()}

    @property
    def fired(self) -> list[str]:
        return [name for name, stats in self.rules.items() if stats.matched]

    @property
    def declines(self) -> list[Decline]:
        return [decline for stats in self.rules.values() for decline in stats.declines]

    def summary_lines(self) -> list[str]:
        """The summary table: Rule | Matched | +Nodes | -Nodes."""
        lines = [
            f"{'Rule':<{NAME_WIDTH}}| Matched | +Nodes | -Nodes",
            f"{'-' * NAME_WIDTH}+---------+--------+-------",
        ]
        for stats in self.rules.values():
            lines.append(
                f"{stats.name:<{NAME_WIDTH}}| {stats.matched:>7} | {stats.nodes_added:>6} | "
                f"{stats.nodes_removed:>6}"
            )
        return lines


class Tracer:
    """Collects trace lines into a report and logs them when enabled."""

    def __init__(self, report: OptimizationReport, enabled: bool) -> None:
        self.report = report
        self.enabled = enabled

    def line(self, text: str, indent: int = 0) -> None:
        text = "  " * indent + text
        self.report.trace_lines.append(text)
        if self.enabled:
            logger.info("%s %s", PREFIX, text)

    def target(self) -> None:
        report = self.report
        self.line(f"Target: {report.ep}, dtype: {report.dtype.name}, role: {report.role}")

    def stage_header(self, text: str) -> None:
        self.line(text)

    def node_count(self, label: str, stage: StageStats) -> None:
        delta = stage.nodes_after - stage.nodes_before
        self.line(f"{label}: {stage.nodes_before} → {stage.nodes_after} nodes ({delta:+d})", 1)

    def rule(self, stats: RuleStats) -> None:
        self.line(f"{stats.name:<{NAME_WIDTH}}: {stats.effect()}", 1)
        for decline in stats.declines[:MAX_DECLINES_SHOWN]:
            self.line(str(decline), 2)
        hidden = len(stats.declines) - MAX_DECLINES_SHOWN
        if hidden > 0:
            self.line(f"... and {hidden} more declines", 2)

    def note(self, text: str) -> None:
        self.line(text, 1)

    def summary(self) -> None:
        self.line("Summary:")
        for text in self.report.summary_lines():
            self.line(text, 1)


@contextlib.contextmanager
def trace_to_stderr(stream: TextIO | None = None) -> Iterator[logging.Handler]:
    """Show the trace (INFO lines of the ``mobius_genai.optimize`` logger) on stderr.

    For command-line tools: attaches a handler for the duration of the block and restores the
    logger afterwards, leaving other loggers alone.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    previous_level = logger.level
    previous_propagate = logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        logger.propagate = previous_propagate
