"""Why rewrite rules refused their candidates, recorded while the rules rewrite.

onnxscript reports a rule's refusals (a ``check()`` that fails or a ``rewrite()`` that
declines, each with its ``MatchResult`` reason) to a `MatchingTracer`, but a rule set given a
tracer only looks and no longer rewrites. So our rules are `RecordingRule`s: a rule hands the
tracer the pipeline attached to it (a `DeclineRecorder`) to its own `try_rewrite`, and the rule
set rewrites as usual. Rule classes derive from `RecordingRuleClassBase`, whose ``rule()`` makes
a `RecordingRule` (with the class's `matcher`); ``RewriteRuleSet(commute=True)`` works, each
commuted copy a `RecordingRule` too. What onnxscript would need for this module to shrink to the
recorder is proposed in docs/ARCHITECTURE.md (optimize row).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.optimize.trace import Decline

__all__ = ["DeclineRecorder", "RecordingRule", "RecordingRuleClassBase"]

#: Reasons for a refusal that came without one (an empty ``MatchResult.fail()``).
_DEFAULT_REASONS = {
    pattern.MatchStatus.CONDITION_FAILED: "check() returned False",
    pattern.MatchStatus.REPLACEMENT_FAILED: "rewrite() declined",
}


class RecordingRule(pattern.RewriteRule):
    """A RewriteRule that reports its refusals to `recorder` while it rewrites."""

    recorder: pattern.MatchingTracer | None = None

    def try_rewrite(self, model, graph_or_function, node, *, verbose=None, tracer=None):
        """RewriteRule.try_rewrite, traced by `recorder` unless the caller passes a tracer."""
        return super().try_rewrite(
            model,
            graph_or_function,
            node,
            verbose=verbose,
            tracer=self.recorder if tracer is None else tracer,
        )

    def commute(self) -> Sequence[RecordingRule]:
        """RewriteRule.commute() (one rule per operand order of the commutative ops), each
        copy a RecordingRule: onnxscript's copies are plain RewriteRules, which record nothing."""
        commuted = []
        for plain in super().commute():
            rule = copy.copy(plain)
            rule.__class__ = RecordingRule
            commuted.append(rule)
        return commuted


class RecordingRuleClassBase(pattern.RewriteRuleClassBase):
    """RewriteRuleClassBase whose ``rule()`` is a `RecordingRule`.

    `matcher` is the pattern matcher class the rule uses (None: onnxscript's default).
    """

    matcher: type[pattern.PatternMatcher] | None = None

    @classmethod
    def rule(cls, *args, **kwargs) -> RecordingRule:
        instance = cls(*args, **kwargs)
        return RecordingRule(
            instance.pattern,
            instance.rewrite,
            instance.check,
            matcher=instance.matcher,
            name=instance.name,
            remove_nodes=instance.remove_nodes,
            graph_pre_visitor=instance.setup,
            graph_post_visitor=instance.cleanup,
            as_function=instance.as_function,
        )


class DeclineRecorder(pattern.MatchingTracer):
    """The refusals of one rule group's rules, each (node, reason) once, in the order met."""

    def __init__(self, group: str) -> None:
        super().__init__()
        self.group = group
        self._found: dict[tuple[int, str], tuple[ir.Node, Decline]] = {}

    def attach(self, rule_set: pattern.RewriteRuleSet) -> pattern.RewriteRuleSet:
        """Make every rule of `rule_set` report to this recorder; returns `rule_set`."""
        for rule in rule_set.rules:
            if not isinstance(rule, RecordingRule):
                raise TypeError(
                    f"Rule {rule} of {self.group} is a {type(rule).__name__}, not a "
                    "RecordingRule: derive it from RecordingRuleClassBase so its declines "
                    "are recorded"
                )
            rule.recorder = self
        return rule_set

    def log(self, rule, container, node, match_result, status) -> None:
        """MatchingTracer's hook: keep failed checks and declined rewrites, with the reason."""
        default = _DEFAULT_REASONS.get(status)
        if default is None:
            return
        reason = match_result.reason or default
        key = (id(node), reason)
        if key not in self._found:
            decline = Decline(self.group, node.name or "", node.op_type, reason)
            self._found[key] = (node, decline)

    def declines(self) -> list[Decline]:
        """Reasons at nodes still in the graph (a refusal later rewritten is no decline)."""
        return [decline for node, decline in self._found.values() if node.graph is not None]
