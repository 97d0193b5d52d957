"""The optimization trace: the spec's lines, decline reasons, the summary, and no effect on graphs."""

from __future__ import annotations

import io
import logging

import onnx
import onnx_ir as ir
import pytest
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchFailureError

from mobius_genai.optimize import FUSIONS, LOWERINGS, optimize_model, trace_to_stderr
from mobius_genai.optimize.declines import DeclineRecorder, RecordingRule, RecordingRuleClassBase
from mobius_genai.optimize.trace import LOGGER_NAME, PREFIX
from tests.optimize._graphs import parse, tiny_config, tiny_decoder

F32 = ir.DataType.FLOAT


def _decoder(layers: int = 3) -> ir.Model:
    config = tiny_config(num_hidden_layers=layers, tie_word_embeddings=True)
    return tiny_decoder(config, weights="none")[0]


def _traced(caplog, model: ir.Model, *args, **kwargs):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        report = optimize_model(model, *args, trace=True, **kwargs)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    return report, lines


def test_trace_lines_follow_the_spec_layout(caplog):
    report, lines = _traced(caplog, _decoder(), "default", F32)
    assert all(line.startswith(f"{PREFIX} ") for line in lines)
    text = [line[len(PREFIX) + 1 :] for line in lines]
    assert text == report.trace_lines
    assert text[0] == "Target: default, dtype: FLOAT, role: decoder"
    headers = [line for line in text if line.startswith("Stage")]
    assert headers == [
        "Stage 1: Cleanup (7 passes)",
        "Stage 2: Fusion (6 rule groups)",
        "Stage 2b: InlinePass (expand unsupported custom ops)",
        "Stage 3: Lowering (0 rule groups for default)",
        "Stage 4: Constant folding",
    ]
    assert any(line.startswith("  Cleanup: ") and "nodes (" in line for line in text)
    assert (
        "  SkipNorm                  : +6 SkipSimplifiedLayerNormalization, -6 Add, "
        "-6 RMSNormalization"
    ) in text
    assert "  FusedMatMul               : +1 FusedMatMul, -1 MatMul, -1 Transpose" in text
    assert "  GeluFusion                : no matches (0 nodes affected)" in text
    assert any(line.startswith("  Fold: ") for line in text)
    summary = text[text.index("Summary:") + 1 :]
    assert summary[:2] == [
        "  Rule                      | Matched | +Nodes | -Nodes",
        "  --------------------------+---------+--------+-------",
    ]
    assert "  SkipNorm                  |       6 |      6 |     12" in summary
    assert len(summary) == 2 + len(report.rules)


def test_the_report_counts_what_the_trace_prints():
    report = optimize_model(_decoder(), "default", F32)
    assert report.matches == {
        "SkipNorm": 6,
        "SkipLayerNorm": 0,
        "GeluFusion": 0,
        "BiasGelu": 0,
        "FusedMatMul": 1,
        "MoE": 0,
        "InlinePass": 0,
    }
    assert report.fired == ["SkipNorm", "FusedMatMul"]
    skip = report.rules["SkipNorm"]
    assert (skip.nodes_added, skip.nodes_removed) == (6, 12)
    assert [stage.name for stage in report.stages] == ["cleanup", "rewrite", "fold"]


def test_without_trace_nothing_is_logged_but_the_lines_are_kept(caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER_NAME):
        report = optimize_model(_decoder(1), "cpu", F32)
    assert [r for r in caplog.records if r.name == LOGGER_NAME] == []
    assert report.trace_lines[0] == "Target: cpu, dtype: FLOAT, role: decoder"


@pytest.mark.parametrize("ep", ["default", "cpu", "onnx-standard", "dml"])
def test_the_graph_is_identical_with_and_without_trace(ep, caplog):
    dtype = ir.DataType.FLOAT16 if ep == "dml" else F32
    graphs = []
    for trace in (False, True):
        config = tiny_config(num_hidden_layers=2, tie_word_embeddings=True)
        model = tiny_decoder(config, dtype="f16" if ep == "dml" else "f32", weights="none")[0]
        with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
            optimize_model(model, ep, dtype, trace=trace)
        graphs.append(onnx.printer.to_text(ir.to_proto(model)))
    assert graphs[0] == graphs[1]


def test_decline_reasons_reach_the_trace(caplog):
    model = parse(
        """agraph (float[2,5,8] x, float[8] skip, float[8] gamma) => (float[2,5,8] y) {
            s = Add(x, skip)
            y = RMSNormalization<axis=-1>(s, gamma)
        }"""
    )
    report, lines = _traced(caplog, model, "cpu", F32)
    (decline,) = report.rules["SkipNorm"].declines
    assert decline.rule == "SkipNorm" and decline.op_type in ("Add", "RMSNormalization")
    assert "do not have provably equal shapes" in decline.reason
    assert any("declined at" in line and decline.reason in line for line in lines)


def test_a_refusal_later_rewritten_by_another_variant_is_no_decline():
    # Add(bias, x): the x-first variant refuses ("bias ... is not a vector"), the
    # bias-first variant fuses; only real refusals are reported.
    model = parse(
        """agraph (float[2,5,8] x, float[8] bias) => (float[2,5,8] y) {
            h = Add(bias, x)
            y = Gelu(h)
        }"""
    )
    report = optimize_model(model, "cpu", F32)
    assert report.matches["BiasGelu"] == 1
    assert report.rules["BiasGelu"].declines == []


def test_trace_to_stderr_shows_the_lines_and_restores_the_logger():
    logger = logging.getLogger(LOGGER_NAME)
    level, handlers = logger.level, list(logger.handlers)
    stream = io.StringIO()
    with trace_to_stderr(stream):
        optimize_model(_decoder(1), "default", F32, trace=True)
    assert stream.getvalue().startswith(
        f"INFO {LOGGER_NAME}: {PREFIX} Target: default, dtype: FLOAT, role: decoder\n"
    )
    assert (logger.level, logger.handlers) == (level, handlers)


class _RefusesInRewrite(RecordingRuleClassBase):
    def pattern(self, op, x):
        return op.Relu(x)

    def rewrite(self, op, x):
        return pattern.MatchResult().fail("refused in rewrite()")


# onnxscript lets a check() refuse by raising MatchFailureError (not exported publicly); our
# rules return MatchResult().fail(reason) instead, but a raised refusal is recorded too.
class _RaisesInCheck(RecordingRuleClassBase):
    def pattern(self, op, x):
        return op.Neg(x)

    def check(self, context, x):
        raise MatchFailureError("refused by raising in check()")

    def rewrite(self, op, x):
        return op.Identity(x)


def test_refusals_from_rewrite_and_raised_in_check_are_recorded_too():
    model = parse(
        """agraph (float[4] x) => (float[4] y, float[4] z) {
            y = Relu(x)
            z = Neg(x)
        }"""
    )
    recorder = DeclineRecorder("Test")
    rules = pattern.RewriteRuleSet([_RefusesInRewrite.rule(), _RaisesInCheck.rule()])
    assert recorder.attach(rules).apply_to_model(model) == 0
    assert sorted((d.op_type, d.reason) for d in recorder.declines()) == [
        ("Neg", "refused by raising in check()"),
        ("Relu", "refused in rewrite()"),
    ]


class _AddNeg(RecordingRuleClassBase):
    """x + (-y) → x - y in the written order; ``commute=True`` makes the swapped order."""

    def pattern(self, op, x, y):
        return op.Add(x, op.Neg(y))

    def check(self, context, x, y):
        return pattern.MatchResult().fail("keep is kept") if y.name == "keep" else True

    def rewrite(self, op, x, y):
        return op.Sub(x, y)


def test_commuted_copies_rewrite_the_swapped_order_and_record_its_refusals():
    model = parse(
        """agraph (float[4] x, float[4] y, float[4] keep) => (float[4] a, float[4] b, float[4] c) {
            n1 = Neg(y)
            a = Add(x, n1)
            n2 = Neg(y)
            b = Add(n2, x)
            n3 = Neg(keep)
            c = Add(n3, x)
        }"""
    )
    recorder = DeclineRecorder("Test")
    rules = pattern.RewriteRuleSet([_AddNeg.rule()], commute=True)
    assert all(isinstance(rule, RecordingRule) for rule in rules.rules) and len(rules.rules) == 2
    assert recorder.attach(rules).apply_to_model(model) == 2
    assert sorted(node.op_type for node in model.graph) == ["Add", "Neg", "Sub", "Sub"]
    assert [(d.op_type, d.reason) for d in recorder.declines()] == [("Add", "keep is kept")]


class _Plain(pattern.RewriteRuleClassBase):
    def pattern(self, op, x):
        return op.Relu(x)

    def rewrite(self, op, x):
        return op.Identity(x)


def test_a_rule_whose_refusals_cannot_be_recorded_is_refused():
    with pytest.raises(TypeError, match="not a RecordingRule"):
        DeclineRecorder("Test").attach(pattern.RewriteRuleSet([_Plain.rule()]))


@pytest.mark.parametrize("group", [*FUSIONS, *LOWERINGS], ids=lambda g: g.name)
def test_every_rule_of_every_rule_group_records_its_refusals(group):
    made = group.make()
    if isinstance(made, pattern.RewriteRuleSet):
        assert all(isinstance(rule, RecordingRule) for rule in made.rules)
    else:
        assert isinstance(made, ir.passes.InPlacePass)
