"""EliminateShapePass: a decoder without ``Shape`` ops, for EPs that cannot run them on device.

WebGPU (``supports_shape_op=False``) needs every size computed on the device, so each live
``Shape`` op of the main graph is replaced by an equal value computed another way:

- dimensions known statically become a constant;
- a dimension of a 2-D integer graph input (``attention_mask``, ``input_ids``: [batch, seq],
  never empty along the other axis) is counted from the data: ``ones = x * 0 + 1``, summed
  along the dimension, ``ReduceMax`` over what is left gives it as int64 [1]. It counts
  positions, not their values, so padding does not matter.

After GQA fusion the only live ``Shape`` is the one deriving GQA's ``total_sequence_length``
from ``attention_mask``; without GQA the mask subgraph's ``Shape(input_ids)`` and
``Shape(attention_mask)`` are handled the same way. Dead ``Shape`` ops (the mask subgraph GQA
replaced) are left for the pipeline's dead-node removal. Any other ``Shape`` is kept and
listed in ``EliminateShapePass.kept`` with the reason, for the trace. Function bodies are not
touched: EPs run their custom ops natively.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.components.tier1 import is_standard_domain

_INTEGER_TYPES = (ir.DataType.INT64, ir.DataType.INT32)


def _live_nodes(graph: ir.Graph) -> set[ir.Node]:
    """Nodes the graph outputs depend on (through subgraphs too)."""
    live: set[ir.Node] = set()
    stack = [value.producer() for value in graph.outputs]
    while stack:
        node = stack.pop()
        if node is None or node in live:
            continue
        live.add(node)
        stack.extend(value.producer() for value in node.inputs if value is not None)
        for attr in node.attributes.values():
            subgraphs = []
            if attr.type == ir.AttributeType.GRAPH:
                subgraphs = [attr.as_graph()]
            elif attr.type == ir.AttributeType.GRAPHS:
                subgraphs = list(attr.as_graphs())
            for subgraph in subgraphs:
                for inner in ir.traversal.RecursiveGraphIterator(subgraph):
                    stack.extend(v.producer() for v in inner.inputs if v is not None)
    return live


def _dim_range(node: ir.Node, rank: int) -> range:
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return range(start, max(start, end))


class EliminateShapePass(ir.passes.InPlacePass):
    """Replace the live ``Shape`` ops of the main graph by constants or data-driven counts."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[str] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        self.kept = []
        live = _live_nodes(graph)
        counted: dict[tuple[ir.Value, int], ir.Value] = {}
        modified = False
        for node in list(graph):
            if node.op_type != "Shape" or not is_standard_domain(node.domain) or node not in live:
                continue
            replacement = self._replacement(graph, node, counted)
            if replacement is None:
                continue
            node.outputs[0].replace_all_uses_with(replacement, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified)

    def _replacement(
        self, graph: ir.Graph, node: ir.Node, counted: dict[tuple[ir.Value, int], ir.Value]
    ) -> ir.Value | None:
        source = node.inputs[0]
        if source is None or source.shape is None:
            self.kept.append(f"{node.name}: input rank unknown")
            return None
        dims = _dim_range(node, len(source.shape))
        static = [source.shape[d] for d in dims]
        if all(isinstance(d, int) for d in static):
            return self._insert(graph, node, _constant_nodes(static))
        if not (
            source.is_graph_input() and source.dtype in _INTEGER_TYPES and len(source.shape) == 2
        ):
            self.kept.append(
                f"{node.name}: shape of {source.name!r} is dynamic and not countable "
                "(only 2-D integer graph inputs are)"
            )
            return None
        parts = []
        for d in dims:
            if isinstance(source.shape[d], int):
                parts.append(self._insert(graph, node, _constant_nodes([source.shape[d]])))
            elif (source, d) in counted:
                parts.append(counted[(source, d)])
            else:
                counted[(source, d)] = self._insert(graph, node, _count_nodes(source, d))
                parts.append(counted[(source, d)])
        if len(parts) == 1:
            return parts[0]
        return self._insert(graph, node, [ir.node("Concat", parts, attributes={"axis": 0})])

    @staticmethod
    def _insert(graph: ir.Graph, before: ir.Node, nodes: list[ir.Node]) -> ir.Value:
        graph.insert_before(before, nodes)
        return nodes[-1].outputs[0]


def _constant_nodes(values: list[int]) -> list[ir.Node]:
    tensor = ir.tensor(np.array(values, dtype=np.int64))
    node = ir.node("Constant", [], attributes={"value": tensor})
    node.outputs[0].const_value = tensor
    return [node]


def _count_nodes(source: ir.Value, axis: int) -> list[ir.Node]:
    """Nodes computing int64 [1] = source.shape[axis] from the data of a 2-D integer tensor."""
    tape = ir.tape.Tape()
    zero = tape.op(
        "Constant", [], attributes={"value": ir.tensor(np.array(0, source.dtype.numpy()))}
    )
    one = tape.op(
        "Constant", [], attributes={"value": ir.tensor(np.array(1, source.dtype.numpy()))}
    )
    ones = tape.op("Add", [tape.op("Mul", [source, zero]), one])
    ones = tape.op("Cast", [ones], attributes={"to": ir.DataType.INT64})
    axes = tape.op("Constant", [], attributes={"value": ir.tensor(np.array([axis], np.int64))})
    counts = tape.op("ReduceSum", [ones, axes], attributes={"keepdims": 0})
    tape.op("ReduceMax", [counts], attributes={"keepdims": 1})
    return list(tape.nodes)
