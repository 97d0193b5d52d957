"""Pre-quantized weights (GPTQ, AWQ, GGUF) into com.microsoft::MatMulNBits, integers unchanged.

Math preserved exactly: ``A @ W`` with ``W[k, n] = (q[n, j] - zero[n, j / bs]) * scale[n, j /
bs]`` at ``k = perm[j]`` becomes ``MatMulNBits(Gather(A, perm, axis=-1), B, scales[, zp])``
where B packs q as stored (bits 4: two per byte, low nibble first; bits 8: one per byte). The
Gather is left out when `perm` is the natural order. Zero points stay implicit (all
2^(bits-1)) or packed uint8; float ones (4- and 8-bit) become integer ones plus block mins
(`_initializers`, quantize/block_mins.py: onnxruntime's cpu kernel refuses 8-bit float zero points and is slow on
4-bit ones). A packed q/k/v projection (`ConcatTensor` of three pre-quantized parts)
concatenates the parts' integers along N when their bits, block size and order agree, else
gets one MatMulNBits per run of agreeing parts and a Concat of their outputs (exact as well).
Pre-quantized tables (an embedding and its tied lm_head) go through `stored_tables`.

One accuracy level for every MatMulNBits written, the target's (the one asked for, else the
EP's default, as for any int4 bundle). At the cpu EP's level 4 onnxruntime's kernel rounds the
activations to int8 (every MatMulNBits written here has integer zero points: the float offsets
of GGUF's Q4_1, Q4_K, Q5_1 and Q5_K become their nearest integer plus block mins for the rest,
`_initializers`), as llama.cpp computes its own Q8_0 / Q4_0 dot products; level 0 keeps them
float, exact to the stored integers, but onnxruntime has no fast 8-bit kernel there
(SmolLM2-135M's Q4_1 bundle decoded 12x slower: benchmarks/README.md, "Packaging a GGUF").
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.prequantized.tensor import (
    ZERO_FORMS,
    PrequantizedTensor,
)
from mobius_genai.checkpoint.weights import ConcatTensor
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.quantize.block_mins import plus_block_mins
from mobius_genai.quantize.graph_writer import GraphWriter
from mobius_genai.quantize.plan import Int4Plan
from mobius_genai.quantize.stored_tables import apply_stored_tables, nbits_arrays, table_uses
from mobius_genai.quantize.streaming import OneWeightCache, PartSpec, lazy_parts

__all__ = ["FLOAT_KINDS", "PrequantizedReport", "apply_prequantized"]

#: Stored kinds that are floats already (GGUF and safetensors spell them alike).
FLOAT_KINDS = frozenset({"F64", "F32", "F16", "BF16"})


@dataclasses.dataclass(frozen=True)
class PrequantizedReport:
    """What `apply_prequantized` wrote, for the manifest and the card."""

    scheme: str
    """The source format as the reader describes it (e.g. "GPTQ 4-bit, group size 128")."""
    accuracy_level: int
    weights: int
    """MatMulNBits nodes written from stored integers."""
    act_order_gathers: int
    block_sizes: tuple[int, ...]
    bits: tuple[int, ...]
    zero_points: dict[str, int]
    """Zero-point form → number of MatMulNBits."""
    dequantized: tuple[str, ...]
    """Pre-quantized weights left as float (no MatMulNBits on this EP, or parts that disagree)."""
    lookups: int = 0
    """GatherBlockQuantized embedding lookups written from stored integers."""
    tensors: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """Stored kind of the source's tensors (GGUF type, "GPTQ 4-bit", safetensors dtype) →
    what happened to them ("kept 4-bit", "kept 8-bit", "dequantized to fp16", "float
    (fp16)", "re-quantized to int4 (block 32, recipe builder)") → how many."""

    def summary(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "format": "MatMulNBits",
            "bits": list(self.bits),
            "block_sizes": list(self.block_sizes),
            "accuracy_level": self.accuracy_level,
            "weights": self.weights,
            "act_order_gathers": self.act_order_gathers,
            "zero_points": dict(self.zero_points),
            "dequantized": list(self.dequantized),
            "lookups": self.lookups,
            "tensors": {kind: dict(outcomes) for kind, outcomes in self.tensors.items()},
        }

    def with_requantized(self, moved: list[tuple[str, str]], precision: str) -> PrequantizedReport:
        """This report with the source tensors `moved` ((stored kind, outcome) each, from
        `requantize.requantize_floats`) counted under their outcome instead of as read in
        float `precision`."""
        kinds = _Kinds(precision)
        kinds.counts = {kind: dict(outcomes) for kind, outcomes in self.tensors.items()}
        for kind, outcome in moved:
            kinds.move(kind, outcome)
        return dataclasses.replace(self, tensors=kinds.counts)


def apply_prequantized(
    model: ir.Model,
    scheme: str,
    plan: Int4Plan,
    keep: bool,
    float_kinds: Mapping[str, int] | None = None,
    precision: str = "fp32",
    why_float: str = "the EP has no MatMulNBits",
) -> PrequantizedReport:
    """Replace each MatMul reading a `PrequantizedTensor` weight by MatMulNBits, in place, and
    the uses of pre-quantized tables by MatMulNBits and (where `plan.gather`)
    GatherBlockQuantized, at `plan.accuracy_level` (see the module docstring).

    With `keep` False (an EP without MatMulNBits, or a float precision asked: `why_float`
    says which) every weight and table stays float: the tensors then read as the format's
    dequantized values. `float_kinds` counts the source's tensors read as float by their
    stored kind, for the report (`precision`: the model's float precision, the words for what
    they became).
    """
    graph = model.graph
    kinds = _Kinds(precision)
    writer = GraphWriter(graph)
    cache = OneWeightCache()
    gathers: dict[tuple[int, bytes], ir.Value] = {}
    block_sums: dict[tuple[int, int], ir.Value] = {}
    written: list[tuple[int, int, str]] = []
    dequantized = []
    for node in list(graph):
        if node.domain != "" or node.op_type != "MatMul" or len(node.inputs) != 2:
            continue
        weight = node.inputs[1]
        parts = _parts(weight)
        if not parts:
            among_floats = _packed_with_floats(weight)
            if among_floats:  # read as float with the float parts packed beside them
                dequantized.append(f"{weight.name} (packed with float parts)")
                kinds.dequantized(among_floats)
            continue
        if not keep:
            dequantized.append(f"{weight.name} ({why_float})")
            kinds.dequantized(parts)
            continue
        kinds.kept(parts)
        new_nodes = _matmul_nbits(writer, cache, node, parts, (gathers, block_sums), written)
        writer.replace(node, new_nodes)
    writer.remove_unused()
    lookups = 0
    if keep:
        tables = apply_stored_tables(model, plan.gather, cache)
        written += tables.matmuls
        lookups = tables.lookups
        dequantized += tables.dequantized
        kinds.kept(tables.kept)
        kinds.dequantized(tables.left_float)
    else:
        tables = [tensor for _, tensor in table_uses(graph)]
        dequantized += [f"{tensor.name} ({why_float})" for tensor in tables]
        kinds.dequantized(tables)
    if written:
        model.opset_imports.setdefault(MS_DOMAIN, 1)
    _set_accuracy_level(graph, plan.accuracy_level)
    kinds.read_as_float(float_kinds or {})
    return PrequantizedReport(
        scheme=scheme,
        accuracy_level=plan.accuracy_level,
        weights=len(written),
        act_order_gathers=len(gathers),
        block_sizes=tuple(sorted({size for _, size, _ in written})),
        bits=tuple(sorted({bits for bits, _, _ in written})),
        zero_points=dict(Counter(form for _, _, form in written)),
        dequantized=tuple(dequantized),
        lookups=lookups,
        tensors=kinds.counts,
    )


def _matmul_nbits(
    writer: GraphWriter,
    cache: OneWeightCache,
    node: ir.Node,
    parts: list[PrequantizedTensor],
    shared: tuple[dict[tuple[int, bytes], ir.Value], dict[tuple[int, int], ir.Value]],
    written: list[tuple[int, int, str]],
) -> list[ir.Node]:
    """The nodes replacing MatMul `node` whose weight is `parts`: one MatMulNBits per run of
    agreeing parts (joined by a Concat), act-order gathers and block sums shared through
    `shared`; each MatMulNBits' (bits, block size, zero-point form) is appended to `written`."""
    gathers, block_sums = shared
    graph, weight = writer.graph, node.inputs[1]
    assert weight is not None
    new_nodes: list[ir.Node] = []
    outputs: list[ir.Value] = []
    for run in _runs(parts):
        first = run[0]
        a = node.inputs[0]
        if first.perm is not None:
            key = (id(a), first.perm.tobytes())
            if key not in gathers:
                gathers[key] = _gather(writer, graph, node, first.perm, len(gathers))
            a = gathers[key]
        zero_form = max((p.zero_form for p in run), key=ZERO_FORMS.index)
        inputs = _initializers(writer, cache, run, weight, zero_form)
        attributes = {"K": int(first.shape[0]), "N": sum(int(p.shape[1]) for p in run)}
        attributes |= {"bits": first.bits, "block_size": first.block_size}
        name = f"{node.name}_Q{len(outputs)}"
        nbits = ir.node("MatMulNBits", [a, *inputs[:3]], attributes, domain=MS_DOMAIN, name=name)
        new_nodes.append(nbits)
        if zero_form == "float":
            new_nodes += plus_block_mins(writer, a, nbits, inputs[3], block_sums)
        outputs.append(new_nodes[-1].outputs[0])
        written.append((first.bits, first.block_size, zero_form))
    if len(outputs) > 1:  # packed parts that differ: one MatMulNBits each, joined
        new_nodes.append(ir.node("Concat", outputs, {"axis": -1}, name=f"{node.name}_Q"))
    return new_nodes


def _set_accuracy_level(graph: ir.Graph, level: int) -> None:
    """`level` on every MatMulNBits of `graph` (0 is the attribute's default: none)."""
    for node in graph:
        if node.domain == MS_DOMAIN and node.op_type == "MatMulNBits":
            node.attributes.pop("accuracy_level", None)
            if level:
                node.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", level)


class _Kinds:
    """What happened to the source's tensors, by stored kind (`PrequantizedReport.tensors`)."""

    def __init__(self, precision: str) -> None:
        self.precision = precision
        self.counts: dict[str, dict[str, int]] = {}
        self._seen: set[object] = set()

    def _add(self, kind: str, outcome: str, count: int = 1) -> None:
        outcomes = self.counts.setdefault(kind, {})
        outcomes[outcome] = outcomes.get(outcome, 0) + count

    def kept(self, tensors: list[PrequantizedTensor]) -> None:
        for tensor in tensors:
            self._once(tensor, f"kept {tensor.bits}-bit")

    def dequantized(self, tensors: list[PrequantizedTensor]) -> None:
        for tensor in tensors:
            self._once(tensor, self._as_float(tensor.scheme))

    def _as_float(self, kind: str) -> str:
        """What reading a tensor of stored `kind` in the model's float precision is called."""
        if kind in FLOAT_KINDS:
            return f"float ({self.precision})"
        return f"dequantized to {self.precision}"

    def move(self, kind: str, outcome: str) -> None:
        """One tensor of `kind` read as float became `outcome` instead."""
        outcomes = self.counts[kind]
        old = self._as_float(kind)
        outcomes[old] -= 1
        if not outcomes[old]:
            del outcomes[old]
        self._add(kind, outcome)

    def _once(self, tensor: PrequantizedTensor, outcome: str) -> None:
        """Count the source tensor once (the parts of a fused one read the same tensor)."""
        key = tensor.sources or id(tensor)
        if key not in self._seen:
            self._seen.add(key)
            self._add(tensor.scheme, outcome)

    def read_as_float(self, float_kinds: Mapping[str, int]) -> None:
        for kind, count in float_kinds.items():
            self._add(kind, self._as_float(kind), count)


def _parts(weight: ir.Value | None) -> list[PrequantizedTensor]:
    """The pre-quantized tensors whose concatenation along N is `weight` (empty: none)."""
    if weight is None or not weight.is_initializer() or weight.is_graph_input():
        return []
    tensor = weight.const_value
    if isinstance(tensor, PrequantizedTensor):
        return [tensor]
    if (
        isinstance(tensor, ConcatTensor)
        and tensor.axis in (1, -1)
        and all(isinstance(part, PrequantizedTensor) for part in tensor.parts)
    ):
        return list(tensor.parts)  # type: ignore[arg-type]
    return []


def _packed_with_floats(weight: ir.Value) -> list[PrequantizedTensor]:
    """The pre-quantized parts of a packed weight (q/k/v) that also holds float parts: one
    MatMul reads them all, so they are read as their dequantized values."""
    tensor = weight.const_value
    if not isinstance(tensor, ConcatTensor):
        return []
    return [part for part in tensor.parts if isinstance(part, PrequantizedTensor)]


def _runs(parts: list[PrequantizedTensor]) -> list[list[PrequantizedTensor]]:
    """Consecutive parts that one MatMulNBits can hold: same bits, block size and order."""
    runs: list[list[PrequantizedTensor]] = []
    for part in parts:
        if runs and _same_layout(runs[-1][0], part):
            runs[-1].append(part)
        else:
            runs.append([part])
    return runs


def _same_layout(a: PrequantizedTensor, b: PrequantizedTensor) -> bool:
    if (a.bits, a.block_size) != (b.bits, b.block_size):
        return False
    if a.perm is None or b.perm is None:
        return a.perm is None and b.perm is None
    return np.array_equal(a.perm, b.perm)


def _gather(
    writer: GraphWriter, graph: ir.Graph, node: ir.Node, perm: np.ndarray, index: int
) -> ir.Value:
    """Gather(A, perm, axis=-1) inserted before `node`: A's features in the stored order."""
    indices = writer.constant(f"{node.name}_act_order", perm.astype(np.int64))
    gather = ir.node(
        "Gather", [node.inputs[0], indices], {"axis": -1}, name=f"{node.name}_perm{index}"
    )
    graph.insert_before(node, gather)
    gather.outputs[0].name = f"{node.name}_act_order_input{index}"
    return gather.outputs[0]


def _initializers(
    writer: GraphWriter,
    cache: OneWeightCache,
    parts: list[PrequantizedTensor],
    weight: ir.Value,
    zero_form: str,
) -> list[ir.Value]:
    """B, scales[, zero_points], computed from the stored integers when saved.

    Float zero points z (GGUF's Q4_1 / Q4_K mins, GPTQ v1) become integer zero points
    round(z) and a fifth tensor, the block mins m = (round(z) - z) * scale [K/bs, N], since
    ``(q - z) * scale = (q - round(z)) * scale + m``: onnxruntime's cpu MatMulNBits has fast
    kernels for integer zero points only (float ones dequantize the whole weight on every call,
    ~50x slower). The rounded zero point centres the integers each block multiplies by the
    activations, which accuracy level 4 rounds to int8, and leaves the small rest to the mins,
    which multiply exact float block sums: SmolLM2-135M's Q4_1 bundle at level 4 is 4x closer
    to the GGUF's float weights than with zero points 0, and decodes no slower
    (benchmarks/README.md, "Decode speed and accuracy level of the GGUF bundle")."""
    first = parts[0]
    k, n = int(first.shape[0]), sum(int(p.shape[1]) for p in parts)
    blocks = k // first.block_size
    dtype = weight.dtype
    base = writer.unique_name(f"{weight.name}_Q{first.bits}")
    specs = [
        PartSpec(base, ir.DataType.UINT8, (n, blocks, first.block_size * first.bits // 8)),
        PartSpec(writer.unique_name(f"{base}_scales"), dtype, (n, blocks)),
    ]
    if zero_form != "implicit":
        per_byte = 8 // first.bits
        shape = (n, (blocks + per_byte - 1) // per_byte)
        specs.append(PartSpec(writer.unique_name(f"{base}_zero_points"), ir.DataType.UINT8, shape))
    if zero_form == "float":
        specs.append(PartSpec(writer.unique_name(f"{base}_mins"), dtype, (blocks, n)))

    def compute() -> list[ir.TensorProtocol]:
        stored = [part.read_blocks() for part in parts]
        arrays = nbits_arrays(stored, first.bits, first.block_size, zero_form, dtype)
        return [ir.Tensor(a, name=s.name) for a, s in zip(arrays, specs, strict=True)]

    tensors = lazy_parts(cache, specs, compute)
    return writer.initializers(specs, tensors)
