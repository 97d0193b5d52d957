"""What the packager and the validator need to know about a decoder graph, read without weights.

`onnx.load(..., load_external_data=False)` reads only the graph, so this stays cheap for a
70B model; the weights in model.onnx.data are never touched. onnx is imported where a graph is
read: the smoke test's process needs `layer_names` only, and importing onnx takes seconds.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mobius_genai.errors import BundleError

if TYPE_CHECKING:
    import onnx

GQA_OP = "com.microsoft::GroupQueryAttention"

_LAYER_INDEX = re.compile(r"\d+")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Element type (onnx.TensorProto enum) and shape; a dim is an int, a symbol or None."""

    elem_type: int
    shape: tuple[int | str | None, ...] | None

    def dim(self, axis: int) -> int | None:
        """The static size of `axis`, or None when it is symbolic or unknown."""
        if self.shape is None or axis >= len(self.shape):
            return None
        value = self.shape[axis]
        return value if isinstance(value, int) else None


@dataclasses.dataclass(frozen=True)
class LayerNames:
    """A family of per-layer graph names: `pattern % i` for each index."""

    pattern: str
    indices: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    """The graph's inputs and outputs, the ops it uses and the external data it reads.

    `external_data` maps each external data file (relative to the .onnx file) to the number of
    bytes the graph reads from it (the largest offset + length), so truncation shows.
    """

    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    ops: frozenset[str] = frozenset()
    external_data: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def has_gqa(self) -> bool:
        """True when attention runs as GroupQueryAttention (the op that shares past/present)."""
        return GQA_OP in self.ops

    @classmethod
    def from_file(cls, path: str | Path) -> GraphInfo:
        """Read an .onnx file's graph (not its external data)."""
        import onnx

        path = Path(path)
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as error:  # onnx raises DecodeError, OSError, ValueError...
            raise BundleError(f"{path.name}: not a readable ONNX model ({error})") from error
        return cls.from_proto(proto)

    @classmethod
    def from_proto(cls, proto: onnx.ModelProto) -> GraphInfo:
        """Summarize a ModelProto (loaded with or without external data)."""
        initializers = {init.name for init in proto.graph.initializer}
        return cls(
            inputs={
                value.name: _spec(value)
                for value in proto.graph.input
                if value.name not in initializers
            },
            outputs={value.name: _spec(value) for value in proto.graph.output},
            ops=frozenset(
                f"{node.domain or 'ai.onnx'}::{node.op_type}" for node in _all_nodes(proto)
            ),
            external_data=_external_data(proto),
        )


def layer_names(names: Iterable[str], role: str) -> LayerNames | None:
    """The per-layer family among `names` whose role is `role` ("key" or "value").

    A name's first run of digits is its layer index: "past_key_values.3.key" belongs to the
    family "past_key_values.%d.key". The role is whichever of "key" / "value" comes last in the
    pattern ("past_key_values.%d.key" is a key family). Returns None when no family has the
    role; raises BundleError when several do.
    """
    families: dict[str, list[int]] = {}
    for name in names:
        match = _LAYER_INDEX.search(name)
        if match is None:
            continue
        pattern = f"{name[: match.start()]}%d{name[match.end() :]}"
        families.setdefault(pattern, []).append(int(match.group()))
    found = [pattern for pattern in families if _role(pattern) == role]
    if not found:
        return None
    if len(found) > 1:
        raise BundleError(
            f"graph: several per-layer {role} name families {sorted(found)}; accepted: one, "
            f"like 'past_key_values.%d.{role}'"
        )
    return LayerNames(found[0], tuple(sorted(families[found[0]])))


def _role(pattern: str) -> str | None:
    lowered = pattern.lower()
    key, value = lowered.rfind("key"), lowered.rfind("value")
    if key == value == -1:
        return None
    return "key" if key > value else "value"


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return TensorSpec(tensor.elem_type, None)
    dims: list[int | str | None] = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorSpec(tensor.elem_type, tuple(dims))


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    import onnx

    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    yield from _graphs(sub)


def _all_nodes(proto: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    for graph in _graphs(proto.graph):
        yield from graph.node
    for function in proto.functions:
        yield from function.node


def _external_data(proto: onnx.ModelProto) -> dict[str, int]:
    import onnx

    needed: dict[str, int] = {}
    for graph in _graphs(proto.graph):
        for tensor in graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            entries = {entry.key: entry.value for entry in tensor.external_data}
            end = int(entries.get("offset", 0)) + int(entries.get("length", 0))
            location = entries.get("location", "")
            needed[location] = max(needed.get(location, 0), end)
    return needed
