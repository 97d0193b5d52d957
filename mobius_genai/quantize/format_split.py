"""Packed weights whose parts the recipe stores in different formats, split into one MatMul
per run of parts that share a format.

PackQKV packs the q/k/v projections into one MatMul (one kernel call per layer), before
quantization. A recipe may store k and v in 8 bits and q in 4 (`mixed`): one MatMulNBits has one
format, so

    MatMul(x, [Wq | Wk | Wv]) = Concat(MatMul(x, Wq), MatMul(x, [Wk | Wv]), axis=-1)

keeps the same columns in the same order. MatMulNBits quantizes each output column on its own
(blocks run along K), so splitting along N changes no quantized value. Each run is a new
initializer (a `ConcatTensor` of its parts, read only when saved).

Only a packed weight whose parts are visible (a `ConcatTensor` initializer, as PackQKV makes)
and whose every use is a plain MatMul is split; otherwise it keeps one format, the widest its
parts ask for (`packed_format`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import onnx_ir as ir

from mobius_genai.checkpoint.weights import ConcatTensor
from mobius_genai.quantize.graph_writer import GraphWriter
from mobius_genai.quantize.recipes import WeightFormat
from mobius_genai.quantize.streaming import PartSpec, WeightSource
from mobius_genai.quantize.weight_uses import MatMulUse, WeightGroup

__all__ = ["FormatOf", "packed_format", "packed_parts", "split_mixed_formats"]

#: The format of a weight or part of `name` in `group` (the recipe's rules).
FormatOf = Callable[[str, WeightGroup], WeightFormat]


def packed_parts(group: WeightGroup) -> tuple[ir.TensorProtocol, ...]:
    """The parts of a packed [K, N] weight concatenated along N (empty when not packed)."""
    source = group.source
    if len(source.values) != 1 or source.stored_nk:
        return ()
    tensor = source.values[0].const_value
    if isinstance(tensor, ConcatTensor) and tensor.axis == 1 and len(tensor.parts) > 1:
        return tensor.parts
    return ()


def packed_format(group: WeightGroup, format_of: FormatOf) -> WeightFormat:
    """The format of `group`: its parts' (the widest, when they differ and it is not split),
    else its own name's."""
    parts = packed_parts(group)
    if not parts:
        return format_of(group.source.name, group)
    return max((format_of(part.name or "", group) for part in parts), key=lambda f: f.bits)


def split_mixed_formats(
    graph: ir.Graph, groups: Sequence[WeightGroup], format_of: FormatOf
) -> list[WeightGroup]:
    """`groups` with every splittable packed weight whose parts differ in format replaced (in
    the graph too) by one group per run of equal formats, in order."""
    writer = GraphWriter(graph)
    result: list[WeightGroup] = []
    for group in groups:
        runs = _runs(group, format_of)
        if len(runs) < 2 or group.gathers or not _plain_matmuls(group.matmuls):
            result.append(group)
            continue
        values = [_run_value(writer, group, run) for run in runs]
        uses: list[list[MatMulUse]] = [[] for _ in values]
        for use in group.matmuls:
            nodes = _split_matmul(use.node, values)
            writer.replace(use.node, nodes)
            for index, node in enumerate(nodes[:-1]):
                uses[index].append(MatMulUse(node, None))
        result.extend(
            WeightGroup(WeightSource((value,)), matmuls=matmuls)
            for value, matmuls in zip(values, uses, strict=True)
        )
    writer.remove_unused()
    return result


def _runs(group: WeightGroup, format_of: FormatOf) -> list[list[ir.TensorProtocol]]:
    """The packed parts of `group` in runs of consecutive parts of one format."""
    parts = packed_parts(group)
    return [
        list(run) for _, run in itertools.groupby(parts, lambda p: format_of(p.name or "", group))
    ]


def _plain_matmuls(uses: Sequence[MatMulUse]) -> bool:
    return all(use.node.domain == "" and use.node.op_type == "MatMul" for use in uses)


def _run_name(parts: Sequence[ir.TensorProtocol]) -> str:
    """`a.k_proj.weight` alone, or `a.k_proj+v_proj.weight` for k and v (dotted components
    the names share at both ends kept once)."""
    names = [(part.name or "weight").split(".") for part in parts]
    if len(names) == 1:
        return ".".join(names[0])
    shortest = min(len(name) for name in names)
    head = 0
    while head < shortest - 1 and len({name[head] for name in names}) == 1:
        head += 1
    tail = 0
    while tail < shortest - head - 1 and len({name[-1 - tail] for name in names}) == 1:
        tail += 1
    middles = "+".join(".".join(name[head : len(name) - tail]) for name in names)
    return ".".join([*names[0][:head], middles, *names[0][len(names[0]) - tail :]])


def _run_value(
    writer: GraphWriter, group: WeightGroup, parts: Sequence[ir.TensorProtocol]
) -> ir.Value:
    """A new [K, n] initializer holding `parts` side by side."""
    packed = group.source.values[0]
    name = writer.unique_name(_run_name(parts))
    width = sum(int(part.shape[1]) for part in parts)
    spec = PartSpec(name, packed.dtype, (group.source.k, width))  # type: ignore[arg-type]
    return writer.initializers([spec], [ConcatTensor(parts, 1, packed.dtype, name)])[0]  # type: ignore[arg-type]


def _split_matmul(node: ir.Node, weights: Sequence[ir.Value]) -> list[ir.Node]:
    """One MatMul per weight, then their Concat along the last axis (last node)."""
    x = node.inputs[0]
    assert x is not None
    nodes = []
    for index, weight in enumerate(weights):
        matmul = ir.node("MatMul", [x, weight], name=f"{node.name}_part{index}")
        out = matmul.outputs[0]
        out.dtype = weight.dtype
        if x.shape is not None:
            out.shape = ir.Shape([*x.shape[:-1], int(weight.shape[1])])  # type: ignore[index]
        nodes.append(matmul)
    outputs = [matmul.outputs[0] for matmul in nodes]
    nodes.append(ir.node("Concat", outputs, {"axis": -1}, name=f"{node.name}_concat"))
    return nodes
