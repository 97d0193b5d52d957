"""Small graph-editing helper shared by the INT4 passes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from mobius_genai.quantize.streaming import PartSpec

__all__ = ["GraphWriter"]


class GraphWriter:
    """Adds initializers and swaps nodes in one graph, then drops what nothing uses any more.

    Only values and nodes that fed a replaced node are candidates for removal, so unrelated
    dead code stays as it was.
    """

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self._names = {value.name for value in graph.initializers.values()}
        self._names.update(value.name for value in graph.inputs)
        self._candidates: list[ir.Value] = []

    def unique_name(self, name: str) -> str:
        """`name`, or `name_<i>` if an initializer or input already has it."""
        candidate, index = name, 1
        while candidate in self._names:
            candidate = f"{name}_{index}"
            index += 1
        self._names.add(candidate)
        return candidate

    def initializers(
        self, specs: Sequence[PartSpec], tensors: Sequence[ir.TensorProtocol] | None
    ) -> list[ir.Value]:
        """Register one initializer per spec (without a value when `tensors` is None)."""
        values = []
        for index, spec in enumerate(specs):
            value = ir.Value(
                name=spec.name,
                type=ir.TensorType(spec.dtype),
                shape=ir.Shape(spec.shape),
                const_value=None if tensors is None else tensors[index],
            )
            self.graph.initializers.add(value)  # (register_initializer insists on a value)
            values.append(value)
        return values

    def constant(self, name: str, array: np.ndarray) -> ir.Value:
        """A small constant initializer (e.g. a Reshape shape)."""
        tensor = ir.tensor(array, name=self.unique_name(name))
        value = ir.Value(
            name=tensor.name,
            type=ir.TensorType(tensor.dtype),
            shape=ir.Shape(tensor.shape),
            const_value=tensor,
        )
        self.graph.register_initializer(value)
        return value

    def replace(self, old: ir.Node, new_nodes: Sequence[ir.Node]) -> None:
        """Put `new_nodes` where `old` was; the last one's output takes over old's output."""
        self._candidates.extend(value for value in old.inputs if value is not None)
        ir.convenience.replace_nodes_and_values(
            self.graph,
            old,
            [old],
            list(new_nodes),
            [old.outputs[0]],
            [new_nodes[-1].outputs[0]],
        )

    def remove_unused(self) -> None:
        """Remove candidate nodes and initializers that nothing reads any more."""
        pending = list(self._candidates)
        while pending:
            value = pending.pop()
            if value.uses() or value.is_graph_output():
                continue
            producer = value.producer()
            # a producer replaced already (a quantized MatMul that fed another: OPT-350m's
            # project_out before its tied head) leaves nothing to remove
            if producer is not None and producer.graph is not self.graph:
                continue
            if producer is not None:
                if any(out.uses() or out.is_graph_output() for out in producer.outputs):
                    continue
                pending.extend(v for v in producer.inputs if v is not None)
                self.graph.remove(producer, safe=True)
            elif value.is_initializer() and not value.is_graph_input():
                self.graph.initializers.pop(value.name)  # type: ignore[arg-type]
        self._candidates.clear()
