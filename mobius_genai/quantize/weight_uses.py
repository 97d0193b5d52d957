"""Which weights of a graph INT4 quantization touches, and where they are used.

A weight is a 2-D float initializer (not overridable as a graph input) used as:

- the B input of a `MatMul`, directly ([K, N]: the linear projections, stored [in, out]),
  through `Transpose(perm=[1, 0])` ([N, K]: the tied lm_head reading the embedding table), or
  through `Concat(axis=1)` of several initializers (packed Q/K/V projections);
- the B input of `com.microsoft::FusedMatMul` with alpha 1 and no transposition of A or of
  batches (transB=1 reads an [N, K] table, e.g. the tied lm_head after fusion);
- the data input of `Gather(axis=0)` indexed by the `input_ids` graph input (the token
  embedding lookup of an [N, K] table), directly or through `Where`s that send some ids to a
  constant row (a vision-language decoder's image tokens reading the pad token's per-layer
  row, Gemma 3n's ids past its per-layer table reading row 0). Other lookups, e.g. learned
  position embeddings, stay float.

Uses that fit none of these are left alone; `Declined` records why, for the report. A weight
its family keeps in float32 (`KEPT_FLOAT32`: a MoE router's, models/families/float32.py) is
found like any other, and `WeightGroup.kept_float32` says int4 leaves it float.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from mobius_genai.checkpoint.reader import KEPT_FLOAT32
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.quantize.plan import BLOCK_SIZES
from mobius_genai.quantize.streaming import WeightSource

__all__ = ["Declined", "GatherUse", "MatMulUse", "WeightGroup", "find_weights"]

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
TOKEN_IDS = "input_ids"


@dataclasses.dataclass(frozen=True)
class MatMulUse:
    """A MatMul (or FusedMatMul) computing A @ W with W read from `WeightGroup.source`."""

    node: ir.Node
    via: ir.Node | None
    """The Transpose or Concat between the initializers and the node (None: direct)."""


@dataclasses.dataclass(frozen=True)
class GatherUse:
    """Gather(table, ids, axis=0) on an [N, K] table."""

    node: ir.Node


@dataclasses.dataclass
class WeightGroup:
    """One weight (as [K, N]) and every use of it: all uses share one quantized copy."""

    source: WeightSource
    matmuls: list[MatMulUse] = dataclasses.field(default_factory=list)
    gathers: list[GatherUse] = dataclasses.field(default_factory=list)

    @property
    def role(self) -> str:
        """'embedding' (lookup only), 'lm_head' (tied table or an lm_head weight) or 'linear'."""
        if not self.matmuls:
            return "embedding"
        if self.gathers or "lm_head" in self.source.name:
            return "lm_head"
        return "linear"

    @property
    def kept_float32(self) -> bool:
        """Its family keeps it in float32 (`KEPT_FLOAT32`): int4 leaves it float."""
        return any(value.meta.get(KEPT_FLOAT32) for value in self.source.values)


@dataclasses.dataclass(frozen=True)
class Declined:
    """A use of a weight-like initializer that is left in float, and why."""

    node: str
    reason: str


def _weight_value(value: ir.Value | None) -> bool:
    """A 2-D float initializer that a user cannot override as a graph input."""
    return (
        value is not None
        and value.is_initializer()
        and not value.is_graph_input()
        and value.dtype in FLOAT_TYPES
        and value.shape is not None
        and value.shape.rank() == 2
        and all(isinstance(dim, int) for dim in value.shape)
    )


def _matmul_source(b: ir.Value) -> tuple[WeightSource, ir.Node | None] | None:
    """The weight behind a MatMul B input, or None when B is not a constant weight."""
    if _weight_value(b):
        return WeightSource((b,)), None
    producer = b.producer()
    if producer is None or producer.domain != "":
        return None
    if producer.op_type == "Transpose":
        perm = producer.attributes.get_ints("perm", None)
        data = producer.inputs[0]
        if _weight_value(data) and (perm is None or list(perm) == [1, 0]):
            return WeightSource((data,), stored_nk=True), producer
        return None
    if producer.op_type == "Concat":
        parts = tuple(producer.inputs)
        if (
            producer.attributes.get_int("axis", 0) in (1, -1)
            and parts
            and all(_weight_value(part) for part in parts)
            and len({(part.shape[0], part.dtype) for part in parts}) == 1  # type: ignore[union-attr]
        ):
            return WeightSource(parts), producer  # type: ignore[arg-type]
    return None


def _fused_matmul_source(node: ir.Node) -> tuple[WeightSource | None, str]:
    b = node.inputs[1]
    if not _weight_value(b):
        return None, ""
    attrs = node.attributes
    if attrs.get_float("alpha", 1.0) != 1.0:
        return None, f"alpha={attrs.get_float('alpha', 1.0)} (only 1 maps to MatMulNBits)"
    for name in ("transA", "transBatchA", "transBatchB"):
        if attrs.get_int(name, 0):
            return None, f"{name}=1 (MatMulNBits has no such option)"
    return WeightSource((b,), stored_nk=bool(attrs.get_int("transB", 0))), ""


def _constant(value: ir.Value | None) -> bool:
    """A value fixed when the graph is built: a Constant node's or an initializer's."""
    if value is None:
        return False
    if value.is_initializer():
        return not value.is_graph_input()
    producer = value.producer()
    return producer is not None and producer.domain == "" and producer.op_type == "Constant"


def _token_ids(ids: ir.Value) -> bool:
    """`ids` is the `input_ids` graph input, or a `Where` choosing between token ids and a
    constant id (whatever the condition): each lookup still reads a row of the token table."""
    if ids.is_graph_input():
        return ids.name == TOKEN_IDS
    producer = ids.producer()
    if producer is None or producer.domain != "" or producer.op_type != "Where":
        return False
    _, first, second = producer.inputs
    return any(
        branch is not None and _token_ids(branch) and _constant(other)
        for branch, other in ((first, second), (second, first))
    )


def find_weights(graph: ir.Graph) -> tuple[list[WeightGroup], list[Declined]]:
    """The weights of `graph` that can be quantized, grouped per weight, in graph order."""
    groups: dict[tuple[tuple[int, ...], bool], WeightGroup] = {}
    declined: list[Declined] = []

    def group_of(source: WeightSource) -> WeightGroup:
        key = (tuple(id(value) for value in source.values), source.stored_nk)
        if key not in groups:
            groups[key] = WeightGroup(source)
        return groups[key]

    for node in graph:
        a = node.inputs[0] if node.inputs else None
        if node.domain == "" and node.op_type == "MatMul":
            found = _matmul_source(node.inputs[1])  # type: ignore[arg-type]
            if found is None:
                continue
            if a is not None and a.shape is not None and a.shape.rank() < 2:
                declined.append(Declined(node.name or "", "input A has rank < 2"))
                continue
            source, via = found
            if source.k < BLOCK_SIZES[0]:
                reason = f"K={source.k} is below the smallest int4 block ({BLOCK_SIZES[0]})"
                declined.append(Declined(node.name or "", reason))
                continue
            group_of(source).matmuls.append(MatMulUse(node, via))
        elif node.domain == MS_DOMAIN and node.op_type == "FusedMatMul":
            source, reason = _fused_matmul_source(node)
            if source is not None:
                group_of(source).matmuls.append(MatMulUse(node, None))
            elif reason:
                declined.append(Declined(node.name or "", reason))
        elif node.domain == "" and node.op_type == "Gather":
            table, ids = node.inputs[0], node.inputs[1]
            if not _weight_value(table):
                continue
            if node.attributes.get_int("axis", 0) != 0:
                declined.append(Declined(node.name or "", "Gather axis is not 0"))
            elif ids is None or not _token_ids(ids):
                reason = f"lookup not indexed by {TOKEN_IDS} (not the token embedding)"
                declined.append(Declined(node.name or "", reason))
            else:
                source = WeightSource((table,), stored_nk=True)  # type: ignore[arg-type]
                group_of(source).gathers.append(GatherUse(node))
    return list(groups.values()), declined
