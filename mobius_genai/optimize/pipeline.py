"""`optimize_model`: the four-stage EP pipeline (the spec's "The Optimization Pipeline").

    Stage 1   Cleanup     identity elimination, CSE, initializer dedup, constant folding,
                          shape inference, metadata cleanup. Always.
    Stage 2   Fusion      the FUSIONS table, each rule group gated by capability fields.
    Stage 2b  InlinePass  expand the com.microsoft functions the EP has no kernel for.
    Stage 3   Lowering    the LOWERINGS table, for EPs that need a construct taken apart.
    Stage 4   Fold        dead nodes, folding, unread graph inputs, unused functions / opsets.

Every decision reads `EpCapabilities` fields (and the model dtype and role), never an EP name;
the gates live in the two tables below, next to the rule they admit. Rule modules are imported
lazily by name, so a rule group whose module is absent is reported as unavailable instead of
breaking the pipeline. Weights are never read: dedup, folding and shape inference only look at
in-memory tensors, so a lazily loaded checkpoint stays on disk until the model is saved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import warnings
from collections.abc import Callable, Iterator

import onnx_ir as ir
import onnx_ir.passes.common as common
import onnxscript.optimizer
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchFailureError
from onnxscript.rewriter._rewrite_rule import ReplacementPatternFunction

from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.registry import get_ep
from mobius_genai.errors import ExecutionProviderError
from mobius_genai.optimize.functions import (
    TIER1_OPS,
    DropUnusedOptionalOutputsPass,
    ep_runs,
    needs_inlining,
    register_functions,
)
from mobius_genai.optimize.trace import (
    Decline,
    OptimizationReport,
    RuleStats,
    StageStats,
    Tracer,
    count_difference,
    op_counts,
)

__all__ = [
    "FUSIONS",
    "LOWERINGS",
    "PROTECTED_INPUTS",
    "ROLES",
    "RuleGroup",
    "Target",
    "optimize_model",
]

ROLES = ("decoder", "vision", "embedding", "encoder")
#: Graph inputs kept even when nothing reads them (onnxruntime-genai always feeds them).
PROTECTED_INPUTS = ("input_ids", "attention_mask")
PROTECTED_INPUT_PREFIXES = ("past_key_values.",)
#: Tensors up to this many elements may be compared (dedup) or folded; weights are larger.
DEDUP_SIZE_LIMIT = 1024
FOLD_INPUT_SIZE_LIMIT = 8192
FOLD_OUTPUT_SIZE_LIMIT = 512 * 512
_RULES_PACKAGE = "mobius_genai.optimize.rules"
_TOOL_METADATA_PREFIX = "pkg.onnxscript."

_logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Target:
    """What a model is optimized for: the EP's capabilities, the model dtype and its role."""

    caps: EpCapabilities
    dtype: ir.DataType
    role: str
    prune_lm_head: bool = False
    """Compute logits for the last position only (bundles for onnxruntime-genai)."""


Gate = Callable[[Target], "str | None"]
"""None when a rule group runs for the target, else the reason it does not."""


@dataclasses.dataclass(frozen=True)
class RuleGroup:
    """One row of a stage table: a rule module and the capability gate that admits it."""

    name: str
    module: str
    """Module under mobius_genai.optimize.rules."""
    gate: Gate
    entry: str = "rules"
    """``rules`` (a RewriteRuleSet factory) or the name of an InPlacePass class."""


def _always(target: Target) -> str | None:
    return None


def _gqa(target: Target) -> str | None:
    if target.role != "decoder":
        return f"role {target.role!r} (GQA is for decoders)"
    if target.dtype not in target.caps.gqa_dtypes:
        return f"{target.dtype.name} not in gqa_dtypes"
    if not target.caps.supports_custom_ops:
        return "supports_custom_ops=False"
    return None


def _pack_qkv(target: Target) -> str | None:
    if target.dtype not in target.caps.qkv_pack_dtypes:
        return f"{target.dtype.name} not in qkv_pack_dtypes"
    return None


def _prune_lm_head(target: Target) -> str | None:
    if target.role != "decoder":
        return f"role {target.role!r} (logits are a decoder's)"
    if not target.prune_lm_head:
        return "prune_lm_head=False (every position's logits kept)"
    return None


def _kernel(op_type: str) -> Gate:
    """Runs when the EP has a kernel for the com.microsoft op the rule emits (functions.py)."""

    def gate(target: Target) -> str | None:
        if not target.caps.supports_custom_ops:
            return "supports_custom_ops=False"
        if not ep_runs(target.caps, op_type):
            return f"{TIER1_OPS[op_type].capability}=False"
        return None

    return gate


def _without(capability: str) -> Gate:
    """Runs when the EP lacks `capability` (a lowering)."""

    def gate(target: Target) -> str | None:
        if getattr(target.caps, capability):
            return f"{capability}=True"
        return None

    return gate


FUSIONS: tuple[RuleGroup, ...] = (
    RuleGroup("GQAFusion", "gqa", _gqa),
    RuleGroup("PackQKV", "pack_qkv", _pack_qkv),
    RuleGroup("SkipNorm", "skip_norm", _kernel("SkipSimplifiedLayerNormalization")),
    RuleGroup("SkipLayerNorm", "skip_layer_norm", _kernel("SkipLayerNormalization")),
    RuleGroup("GeluFusion", "gelu", _always),
    RuleGroup("BiasGelu", "bias_gelu", _kernel("BiasGelu")),
    RuleGroup("FusedMatMul", "fused_matmul", _kernel("FusedMatMul")),
    # Last: it slices the activations entering the fused, row-wise ops after the last attention.
    RuleGroup("PruneLmHead", "prune_lm_head", _prune_lm_head, "PruneLmHeadPass"),
)

LOWERINGS: tuple[RuleGroup, ...] = (
    RuleGroup("UnpackQKV", "unpack_qkv", _without("supports_fused_rope")),
    RuleGroup("SeparateRoPE", "separate_rope", _without("supports_fused_rope")),
    RuleGroup("SimplifiedNorm", "simplified_norm", _without("supports_rms_normalization")),
    RuleGroup(
        "EliminateShape", "eliminate_shape", _without("supports_shape_op"), "EliminateShapePass"
    ),
)


# --- passes -------------------------------------------------------------------------------


def _on_disk(tensor: ir.TensorProtocol | None) -> bool:
    """Data not in memory yet: a lazily read checkpoint tensor or external data."""
    return isinstance(tensor, (ir.LazyTensor, ir.ExternalTensor))


@contextlib.contextmanager
def _on_disk_tensors_hidden(model: ir.Model) -> Iterator[None]:
    """Initializers whose data is on disk look like initializers without data in the block.

    Passes then treat them as they treat a graph built without weights (skip them, or keep
    only their type and shape) instead of loading them; the tensors come back afterwards.
    """
    hidden: dict[ir.Value, ir.TensorProtocol] = {}
    for graph in model.graphs():
        for value in graph.initializers.values():
            if _on_disk(value.const_value):
                hidden[value] = value.const_value
                value.const_value = None
    try:
        yield
    finally:
        for value, tensor in hidden.items():
            value.const_value = tensor


def _small_enough_to_fold(node: ir.Node) -> bool | None:
    """Veto (False) folding a node that reads a weight; None leaves it to the size limits.

    A weight is a tensor not in memory (folding would load it), a large one, or a shared
    initializer beyond the dedup size (folding would keep it and add a copy).
    """
    for value in node.inputs:
        tensor = None if value is None else value.const_value
        if tensor is None:
            continue
        if _on_disk(tensor) or tensor.size >= FOLD_INPUT_SIZE_LIMIT:
            return False
        if value.is_initializer() and tensor.size > DEDUP_SIZE_LIMIT and len(value.uses()) > 1:
            return False
    return None


class FoldConstantsPass(ir.passes.InPlacePass):
    """onnxscript's constant folding, limited to small in-memory tensors.

    onnxscript folds a Transpose of a large initializer that has one reader regardless of the
    input limit; the veto (`_small_enough_to_fold`) keeps weights out of folding altogether, so
    a tied ``Transpose(embed_table)`` stays a Transpose of the shared table instead of becoming a
    second copy of it, and a lazily loaded checkpoint is not read.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = onnxscript.optimizer.fold_constants(
            model,
            input_size_limit=FOLD_INPUT_SIZE_LIMIT,
            output_size_limit=FOLD_OUTPUT_SIZE_LIMIT,
            should_fold=_small_enough_to_fold,
        )
        return ir.passes.PassResult(model, result.modified)


class _DropRecords(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def _silenced(logger_name: str, prefix: str) -> Iterator[None]:
    log = logging.getLogger(logger_name)
    record_filter = _DropRecords(prefix)
    log.addFilter(record_filter)
    try:
        yield
    finally:
        log.removeFilter(record_filter)


class DeduplicateInMemoryInitializersPass(ir.passes.InPlacePass):
    """onnx-ir's initializer dedup over in-memory tensors of at most DEDUP_SIZE_LIMIT elements.

    It merges the small constants components and folding create. Checkpoint tensors are left
    out (they stay on disk until the model is saved; tied weights are shared by construction),
    and so are larger tensors (skipped by their shape, unread). The pass's warning for each
    initializer without data (all of them in a graph built without weights) is dropped.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        dedup = common.DeduplicateInitializersPass(size_limit=DEDUP_SIZE_LIMIT)
        logger_name = "onnx_ir.passes.common.initializer_deduplication"
        with _silenced(logger_name, "Skipped deduplication"), _on_disk_tensors_hidden(model):
            return dedup(model)


class ShapeInferenceInMemoryPass(ir.passes.InPlacePass):
    """onnx-ir's ShapeInferencePass without loading checkpoint tensors.

    ShapeInferencePass serializes initializers below 1 KB to call onnx's shape inference; the
    on-disk ones are presented by type and shape only (as for a graph built without weights).
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        with _on_disk_tensors_hidden(model):
            return common.ShapeInferencePass(strict_mode=False)(model)


class StripToolMetadataPass(ir.passes.InPlacePass):
    """Remove onnxscript's bookkeeping metadata (``pkg.onnxscript.*``) from nodes.

    Everything else stays, in particular the ``mobius.*`` facts rules read (e.g. the sliding
    window on Attention nodes), which ClearMetadataAndDocStringPass would erase.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        nodes = list(model.graph.all_nodes())
        for function in model.functions.values():
            nodes.extend(function.all_nodes())
        for node in nodes:
            for key in [k for k in node.metadata_props if k.startswith(_TOOL_METADATA_PREFIX)]:
                del node.metadata_props[key]
                modified = True
        return ir.passes.PassResult(model, modified)


class RemoveUnreadInputsPass(ir.passes.InPlacePass):
    """Drop graph inputs nothing reads (e.g. position_ids once GQA derives positions).

    input_ids, attention_mask and the past_key_values.* inputs always stay: onnxruntime-genai
    feeds them whether or not the graph reads them.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        unread = [
            value
            for value in graph.inputs
            if not value.uses()
            and not value.is_graph_output()
            and not value.is_initializer()
            and value.name not in PROTECTED_INPUTS
            and not (value.name or "").startswith(PROTECTED_INPUT_PREFIXES)
        ]
        for value in unread:
            graph.inputs.remove(value)
        return ir.passes.PassResult(model, bool(unread))


def _cleanup_passes() -> list[ir.passes.InPlacePass]:
    return [
        common.IdentityEliminationPass(),
        common.CommonSubexpressionEliminationPass(),
        DeduplicateInMemoryInitializersPass(),
        FoldConstantsPass(),
        common.RemoveUnusedNodesPass(),
        ShapeInferenceInMemoryPass(),
        StripToolMetadataPass(),
    ]


def _fold_passes() -> list[ir.passes.InPlacePass]:
    return [
        common.RemoveUnusedNodesPass(),
        FoldConstantsPass(),
        common.RemoveUnusedNodesPass(),
        RemoveUnreadInputsPass(),
        DropUnusedOptionalOutputsPass(),
        common.RemoveUnusedFunctionsPass(),
        common.RemoveUnusedOpsetsPass(),
        StripToolMetadataPass(),
    ]


# --- decline reasons ------------------------------------------------------------------------


class _DeclineRecorder:
    """Wraps a rule set's conditions and replacements to keep the reasons they refuse.

    onnxscript hands the reasons only to a MatchingTracer, and a tracer turns rewriting off, so
    the rules are rebuilt around recording callbacks instead. This reaches into RewriteRule's
    private fields (onnxscript 0.7); if they change, rules run unwrapped and reasons are lost
    (tests/optimize/test_trace.py notices).
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self._found: dict[tuple[int, str], tuple[ir.Node, Decline]] = {}

    def wrap(self, rule_set: pattern.RewriteRuleSet) -> pattern.RewriteRuleSet:
        return pattern.RewriteRuleSet([self._wrap(rule) for rule in rule_set.rules])

    def _wrap(self, rule: pattern.RewriteRule) -> pattern.RewriteRule:
        try:
            condition = rule._condition_function
            replacement = rule._replacement_pattern
            target_pattern = rule._target_pattern
            matcher = type(rule._matcher)
        except AttributeError:  # pragma: no cover - depends on onnxscript internals
            _logger.debug("cannot record decline reasons of %s", rule)
            return rule

        def recording_condition(context, **bindings):
            try:
                result = condition(context, **bindings)
            except MatchFailureError as error:
                self.record(context.root, error.reason)
                raise
            if not result:
                reason = getattr(result, "reason", "") or "check() returned False"
                self.record(context.root, reason)
            return result

        return pattern.RewriteRule(
            target_pattern,
            _RecordingReplacement(replacement, self),
            recording_condition,
            matcher=matcher,
            name=rule.name,
            remove_nodes=rule.remove_nodes,
            graph_pre_visitor=rule.graph_pre_visitor,
            graph_post_visitor=rule.graph_post_visitor,
            as_function=rule.as_function,
        )

    def record(self, node: ir.Node | None, reason: str) -> None:
        if node is None:
            return
        key = (id(node), reason)
        if key not in self._found:
            decline = Decline(self.group, node.name or "", node.op_type, reason)
            self._found[key] = (node, decline)

    def declines(self) -> list[Decline]:
        """Reasons at nodes still in the graph (a refusal later rewritten is no decline)."""
        return [decline for node, decline in self._found.values() if node.graph is not None]


class _RecordingReplacement(ReplacementPatternFunction):
    def __init__(self, inner: ReplacementPatternFunction, recorder: _DeclineRecorder) -> None:
        super().__init__(None)
        self._inner = inner
        self._recorder = recorder

    def get_replacement(self, match):
        replacement = self._inner.get_replacement(match)
        if replacement is None and match.nodes:
            self._recorder.record(match.nodes[-1], match.reason or "rewrite() declined")
        return replacement


# --- stages ---------------------------------------------------------------------------------


def _load(group: RuleGroup) -> object | None:
    module_name = f"{_RULES_PACKAGE}.{group.module}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        return None
    return getattr(module, group.entry)


def _run_passes(model: ir.Model, passes: list[ir.passes.InPlacePass], name: str) -> StageStats:
    before = len(model.graph)
    for each in passes:
        each(model)
    return StageStats(name, before, len(model.graph))


def _run_group(model: ir.Model, group: RuleGroup, entry: object, stage: str) -> RuleStats:
    before = op_counts(model)
    stats = RuleStats(group.name, stage)
    if group.entry == "rules":
        recorder = _DeclineRecorder(group.name)
        stats.matched = recorder.wrap(entry()).apply_to_model(model)
        register_functions(model)
        stats.declines = recorder.declines()
    else:
        each = entry()
        each(model)
        # A pass may list what it left alone and why (e.g. EliminateShapePass.kept).
        stats.declines = [
            Decline(group.name, "", "", str(text)) for text in getattr(each, "kept", [])
        ]
    stats.added, stats.removed = count_difference(before, op_counts(model))
    if group.entry != "rules":
        # A pass may count its own rewrites (e.g. PruneLmHeadPass.matched); else nodes removed.
        stats.matched = getattr(each, "matched", stats.nodes_removed)
    return stats


def _run_table(
    model: ir.Model,
    table: tuple[RuleGroup, ...],
    target: Target,
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
        entry = _load(group)
        if entry is None:
            report.unavailable.append(group.name)
            tracer.note(
                f"{group.name:<26}: not available ({_RULES_PACKAGE}.{group.module} missing)"
            )
            continue
        stats = _run_group(model, group, entry, stage)
        report.rules[group.name] = stats
        tracer.rule(stats)


def _inline(model: ir.Model, caps: EpCapabilities, tracer: Tracer, report: OptimizationReport):
    tracer.stage_header("Stage 2b: InlinePass (expand unsupported custom ops)")
    stats = RuleStats("InlinePass", "inline")
    expand = {key for key, function in model.functions.items() if needs_inlining(function, caps)}
    if expand:
        before = op_counts(model)
        stats.matched = sum(1 for node in model.graph.all_nodes() if node.op_identifier() in expand)
        common.InlinePass(criteria=lambda function: needs_inlining(function, caps))(model)
        stats.added, stats.removed = count_difference(before, op_counts(model))
    report.rules[stats.name] = stats
    tracer.rule(stats)
    unrunnable = sorted(
        {
            f"{node.domain}::{node.op_type}"
            for node in model.graph.all_nodes()
            if not ep_runs(caps, node.op_type, node.domain)
        }
    )
    if unrunnable:
        raise ExecutionProviderError(
            f"Execution provider {caps.name!r} cannot run {unrunnable} and the model has no "
            f"function body to expand them into standard ONNX"
        )


def _check_gqa(model: ir.Model, target: Target, report: OptimizationReport, tracer: Tracer):
    """The spec's fusion assertion: GQA expected for (ep, dtype) but none formed."""
    if _gqa(target) is not None:
        return
    counts = op_counts(model)
    attention = counts.get("Attention", 0)
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
) -> OptimizationReport:
    """Optimize `model` in place for execution provider `ep`; returns what each rule did.

    `dtype` is the model's float dtype and `model_role` its role in the package ("decoder",
    "vision", "embedding", "encoder"); only decoders get GQA. `prune_lm_head` makes a decoder
    compute logits for the last position only (rules/prune_lm_head.py), what onnxruntime-genai
    reads; parity checks against transformers need it off. With `trace=True` every step is
    logged at INFO on the ``mobius_genai.optimize`` logger; the resulting graph is the same.
    Raises ValueError (ExecutionProviderError) for an unknown EP name.
    """
    caps = ep if isinstance(ep, EpCapabilities) else get_ep(ep)
    if not isinstance(dtype, ir.DataType):
        raise TypeError(f"optimize_model() expects an ir.DataType dtype, got {dtype!r}")
    if model_role not in ROLES:
        raise ValueError(f"Unknown model_role {model_role!r}. Supported: {list(ROLES)}")
    target = Target(caps, dtype, model_role, prune_lm_head)
    report = OptimizationReport(ep=caps.name, dtype=dtype, role=model_role)
    tracer = Tracer(report, trace)
    tracer.target()

    cleanup = _cleanup_passes()
    tracer.stage_header(f"Stage 1: Cleanup ({len(cleanup)} passes)")
    report.stages.append(_run_passes(model, cleanup, "cleanup"))
    tracer.node_count("Cleanup", report.stages[-1])

    before = len(model.graph)
    fusion_header = "Stage 2: Fusion ({count} {groups})"
    _run_table(model, FUSIONS, target, "fusion", fusion_header, report, tracer)
    _check_gqa(model, target, report, tracer)
    _inline(model, caps, tracer, report)
    lowering_header = f"Stage 3: Lowering ({{count}} {{groups}} for {caps.name})"
    _run_table(model, LOWERINGS, target, "lowering", lowering_header, report, tracer)
    report.stages.append(StageStats("rewrite", before, len(model.graph)))

    fold = _fold_passes()
    tracer.stage_header("Stage 4: Constant folding")
    report.stages.append(_run_passes(model, fold, "fold"))
    tracer.node_count("Fold", report.stages[-1])
    tracer.summary()
    return report
