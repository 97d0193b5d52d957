"""`optimize_model`: the four-stage EP pipeline (the spec's "The Optimization Pipeline").

    Stage 1   Cleanup     identity elimination, CSE, initializer dedup, constant folding,
                          shape inference, metadata cleanup. Always.
    Stage 2   Fusion      the FUSIONS table, each rule group gated by capability fields.
    Stage 2b  InlinePass  expand the com.microsoft functions the EP has no kernel for.
    Stage 3   Lowering    the LOWERINGS table, for EPs that need a construct taken apart.
    Stage 4   Fold        dead nodes, folding, unread graph inputs, unused functions / opsets.

The tables and their capability gates are in gates.py, the passes of Stages 1 and 4 in
passes.py, the recording of rule refusals in declines.py and the trace in trace.py.
"""

from __future__ import annotations

import warnings

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.rewriter import pattern

from mobius_genai.components.tier1 import (
    MS_DOMAIN,
    ep_runs,
    left_for_int4,
    needs_inlining,
    register_functions,
)
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.registry import resolve_ep
from mobius_genai.errors import ExecutionProviderError
from mobius_genai.optimize.declines import DeclineRecorder
from mobius_genai.optimize.gates import FUSIONS, LOWERINGS, ROLES, GateInput, RuleGroup, gqa_gate
from mobius_genai.optimize.passes import cleanup_passes, fold_passes
from mobius_genai.optimize.rules import gqa
from mobius_genai.optimize.trace import (
    Decline,
    OptimizationReport,
    RuleStats,
    StageStats,
    Tracer,
    count_difference,
    op_counts,
)

__all__ = ["optimize_model"]


def _run_passes(model: ir.Model, passes: list[ir.passes.InPlacePass], name: str) -> StageStats:
    before = len(model.graph)
    ir.passes.Sequential(*passes)(model)
    return StageStats(name, before, len(model.graph))


def _run_group(model: ir.Model, group: RuleGroup, stage: str) -> RuleStats:
    before = op_counts(model)
    stats = RuleStats(group.name, stage)
    made = group.make()
    if isinstance(made, pattern.RewriteRuleSet):
        recorder = DeclineRecorder(group.name)
        stats.matched = recorder.attach(made).apply_to_model(model)
        register_functions(model)
        stats.declines = recorder.declines()
        stats.added, stats.removed = count_difference(before, op_counts(model))
        return stats
    made(model)
    # A pass may count the ops it keeps for a kernel (e.g. FusedMoEPass.kept_ops).
    stats.kept = getattr(made, "kept_ops", stats.kept)
    # A pass may list what it left alone and why (e.g. EliminateShapePass.kept).
    stats.declines = [Decline(group.name, "", "", str(text)) for text in getattr(made, "kept", [])]
    stats.added, stats.removed = count_difference(before, op_counts(model))
    # A pass may count its own rewrites (e.g. PruneLmHeadPass.matched); else nodes removed.
    stats.matched = getattr(made, "matched", stats.nodes_removed)
    return stats


def _run_table(
    model: ir.Model,
    table: tuple[RuleGroup, ...],
    target: GateInput,
    stage: str,
    header: str,
    report: OptimizationReport,
    tracer: Tracer,
) -> None:
    admitted = []
    for group in table:
        reason = group.gate(target)
        if reason is None:
            admitted.append(group)
        else:
            report.skipped[group.name] = reason
    count = len(admitted)
    tracer.stage_header(
        header.format(count=count, groups="rule group" if count == 1 else "rule groups")
    )
    skipped = [f"{g.name} ({report.skipped[g.name]})" for g in table if g not in admitted]
    if skipped:
        tracer.note(f"not for this target: {', '.join(skipped)}")
    for group in admitted:
        stats = _run_group(model, group, stage)
        report.rules[group.name] = stats
        tracer.rule(stats)


def _inline(
    model: ir.Model,
    caps: EpCapabilities,
    tracer: Tracer,
    report: OptimizationReport,
    int4_experts: bool = False,
):
    """Expand the functions of ops the EP cannot run, and of those whose keeping group
    declined for this target (its role or dtype); with `int4_experts`, not those int4
    quantizes first (`left_for_int4`), which it expands itself."""
    tracer.stage_header("Stage 2b: InlinePass (expand unsupported custom ops)")
    stats = RuleStats("InlinePass", "inline")
    declined = {group.keeps for group in FUSIONS if group.keeps and group.name in report.skipped}

    def expands(function: ir.Function) -> bool:
        if int4_experts and left_for_int4(function.name, function.domain, function.overload):
            return False
        declined_op = function.domain == MS_DOMAIN and function.name in declined
        return declined_op or needs_inlining(function, caps)

    expand = {key for key, function in model.functions.items() if expands(function)}
    if expand:
        before = op_counts(model)
        stats.matched = sum(1 for node in model.graph.all_nodes() if node.op_identifier() in expand)
        common.InlinePass(criteria=expands)(model)
        stats.added, stats.removed = count_difference(before, op_counts(model))
    report.rules[stats.name] = stats
    tracer.rule(stats)
    unrunnable = sorted(
        {
            f"{node.domain}::{node.op_type}"
            for node in model.graph.all_nodes()
            if not ep_runs(caps, node.op_type, node.domain)
            and not (int4_experts and left_for_int4(node.op_type, node.domain, node.overload))
        }
    )
    if unrunnable:
        raise ExecutionProviderError(
            f"Execution provider {caps.name!r} cannot run {unrunnable} and the model has no "
            f"function body to expand them into standard ONNX"
        )


def _check_gqa(model: ir.Model, target: GateInput, report: OptimizationReport, tracer: Tracer):
    """The spec's fusion assertion: GQA expected for (ep, dtype) but none formed."""
    if gqa_gate(target) is not None:
        return
    counts = op_counts(model)
    # Attention whose mask is not causal (image tokens seeing each other), chunked, ALiBi's,
    # biased by key (Doge's) or a sparse attention indexer's is meant to stay, and so is
    # attention with sinks where GQA takes no head_sink.
    sinks_stay = not target.caps.supports_gqa_head_sink
    attention = sum(
        1
        for node in model.graph.all_nodes()
        if node.op_type == "Attention"
        and node.domain in ("", "ai.onnx")
        and gqa.mask_stays(node.inputs[3] if len(node.inputs) > 3 else None) is None
        and not (sinks_stay and node.attributes.get_int("qk_matmul_output_mode", 0))
    )
    if counts.get("GroupQueryAttention", 0) == 0 and attention:
        message = (
            f"GQA fusion expected for ep={target.caps.name!r}/dtype={target.dtype.name} but "
            f"found 0 GroupQueryAttention and {attention} Attention nodes. The model may run "
            "slower than expected on this EP. Check that the attention pattern matches the GQA "
            "rewrite rule."
        )
        report.warnings.append(message)
        tracer.note(f"WARNING: {message}")
        warnings.warn(message, UserWarning, stacklevel=3)


def optimize_model(
    model: ir.Model,
    ep: str | EpCapabilities = "default",
    dtype: ir.DataType = ir.DataType.FLOAT,
    model_role: str = "decoder",
    trace: bool = False,
    *,
    prune_lm_head: bool = False,
    int4_experts: bool = False,
) -> OptimizationReport:
    """Optimize `model` in place for execution provider `ep`; returns what each rule did.

    `dtype` is the model's float dtype and `model_role` its role in the package ("decoder",
    "vision", "embedding", "encoder"); only decoders get GQA. `prune_lm_head` makes a decoder
    compute logits for the last position only (rules/prune_lm_head.py), what onnxruntime-genai
    reads; parity checks against transformers need it off. With `trace=True` every step is
    logged at INFO on the ``mobius_genai.optimize`` logger; the resulting graph is the same.
    `int4_experts` (int4 follows) leaves the MoE nodes whose experts int4 stores in 4 bits
    (components/tier1.py's `INT4_MOE_OVERLOADS`) for quantize/, which expands them.
    Raises ExecutionProviderError (a ValueError) for an unknown EP name.
    """
    caps = resolve_ep(ep)
    if not isinstance(dtype, ir.DataType):
        raise TypeError(f"optimize_model() expects an ir.DataType dtype, got {dtype!r}")
    if model_role not in ROLES:
        raise ValueError(f"Unknown model_role {model_role!r}. Supported: {list(ROLES)}")
    target = GateInput(caps, dtype, model_role, prune_lm_head)
    report = OptimizationReport(ep=caps.name, dtype=dtype, role=model_role)
    tracer = Tracer(report, trace)
    tracer.target()
    register_functions(model)  # Tier-1 ops components emit directly (MoE)

    cleanup = cleanup_passes()
    tracer.stage_header(f"Stage 1: Cleanup ({len(cleanup)} passes)")
    report.stages.append(_run_passes(model, cleanup, "cleanup"))
    tracer.node_count("Cleanup", report.stages[-1])

    before = len(model.graph)
    fusion_header = "Stage 2: Fusion ({count} {groups})"
    _run_table(model, FUSIONS, target, "fusion", fusion_header, report, tracer)
    _check_gqa(model, target, report, tracer)
    _inline(model, caps, tracer, report, int4_experts)
    lowering_header = f"Stage 3: Lowering ({{count}} {{groups}} for {caps.name})"
    _run_table(model, LOWERINGS, target, "lowering", lowering_header, report, tracer)
    report.stages.append(StageStats("rewrite", before, len(model.graph)))

    fold = fold_passes()
    tracer.stage_header("Stage 4: Constant folding")
    report.stages.append(_run_passes(model, fold, "fold"))
    tracer.node_count("Fold", report.stages[-1])
    tracer.summary()
    return report
