"""The onnx-ir passes of Stage 1 (cleanup) and Stage 4 (fold), kept off the weights.

Dedup, folding and shape inference only look at in-memory tensors, so a lazily loaded
checkpoint stays on disk until the model is saved.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import onnx_ir as ir
import onnx_ir.passes.common as common
import onnxscript.optimizer

from mobius_genai.components.tier1 import DropUnusedOptionalOutputsPass

__all__ = [
    "PROTECTED_INPUTS",
    "DeduplicateInMemoryInitializersPass",
    "FoldConstantsPass",
    "RemoveUnreadInputsPass",
    "ShapeInferenceInMemoryPass",
    "StripToolMetadataPass",
    "cleanup_passes",
    "fold_passes",
]

#: Graph inputs kept even when nothing reads them (onnxruntime-genai always feeds them).
PROTECTED_INPUTS = ("input_ids", "attention_mask")
PROTECTED_INPUT_PREFIXES = ("past_key_values.",)
#: Tensors up to this many elements may be compared (dedup) or folded; weights are larger.
DEDUP_SIZE_LIMIT = 1024
FOLD_INPUT_SIZE_LIMIT = 8192
FOLD_OUTPUT_SIZE_LIMIT = 512 * 512
_TOOL_METADATA_PREFIX = "pkg.onnxscript."


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


def cleanup_passes() -> list[ir.passes.InPlacePass]:
    """Stage 1, in order."""
    return [
        common.IdentityEliminationPass(),
        common.CommonSubexpressionEliminationPass(),
        DeduplicateInMemoryInitializersPass(),
        FoldConstantsPass(),
        common.RemoveUnusedNodesPass(),
        ShapeInferenceInMemoryPass(),
        StripToolMetadataPass(),
    ]


def fold_passes() -> list[ir.passes.InPlacePass]:
    """Stage 4, in order."""
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
