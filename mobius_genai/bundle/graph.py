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

from mobius_genai._graph_keys import BUILT_FOR_KEY
from mobius_genai.config.recurrent import state_suffixes
from mobius_genai.errors import BundleError

if TYPE_CHECKING:
    import onnx

GQA_OP = "com.microsoft::GroupQueryAttention"

_LAYER_INDEX = re.compile(r"\d+")

#: Attention ops → the attributes holding their query and key/value head counts.
_HEAD_ATTRIBUTES: Mapping[str, tuple[str, str | None]] = {
    "ai.onnx::Attention": ("q_num_heads", "kv_num_heads"),
    GQA_OP: ("num_heads", "kv_num_heads"),
    "com.microsoft::MultiHeadAttention": ("num_heads", None),
    "com.microsoft::SparseAttention": ("num_heads", "kv_num_heads"),
}
#: Ops that rotate by position → the input holding the cos table [positions, rotary_dim / 2].
_COS_TABLE_INPUT: Mapping[str, int] = {
    "ai.onnx::RotaryEmbedding": 1,
    "com.microsoft::RotaryEmbedding": 2,
    GQA_OP: 7,
}
#: Ops that gather embedding rows → the input holding the token ids.
_GATHER_INDICES: Mapping[str, int] = {
    "ai.onnx::Gather": 1,
    "com.microsoft::GatherBlockQuantized": 1,
}


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
    """The graph's inputs and outputs, the ops it uses, the external data it reads, and the
    sizes genai_config must repeat.

    `external_data` maps each external data file (relative to the .onnx file) to the number of
    bytes the graph reads from it (the largest offset + length), so truncation shows.
    `attention_heads` / `attention_kv_heads` are the head counts the attention ops' attributes
    name; `embedding_widths` maps a graph input of token ids to the widths of the embedding rows
    it gathers (the hidden size; Gemma 4's per-layer table is read by the same ids); `rotary_positions` is the number of positions the rotary
    cos/sin tables cover (the fewest, when several), None without such tables;
    `built_for` is the EP the graph's metadata says it was built for (None if unsaid).
    """

    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    ops: frozenset[str] = frozenset()
    external_data: Mapping[str, int] = dataclasses.field(default_factory=dict)
    attention_heads: frozenset[int] = frozenset()
    attention_kv_heads: frozenset[int] = frozenset()
    embedding_widths: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)
    rotary_positions: int | None = None
    built_for: str | None = None

    @property
    def has_gqa(self) -> bool:
        """True when attention runs as GroupQueryAttention (the op that shares past/present)."""
        return GQA_OP in self.ops

    @property
    def shares_kv_buffer(self) -> bool:
        """True when every layer attends with GroupQueryAttention, so og may feed each past in
        its present's buffer: a standard Attention layer (Llama 4's chunked ones) returns its
        past with the new tokens appended, longer than the past, which a shared buffer cannot
        hold."""
        return self.has_gqa and "ai.onnx::Attention" not in self.ops

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
        initializers = {init.name: init for init in proto.graph.initializer}
        inputs = {
            value.name: _spec(value)
            for value in proto.graph.input
            if value.name not in initializers
        }
        heads, kv_heads = _attention_heads(proto)
        return cls(
            inputs=inputs,
            outputs={value.name: _spec(value) for value in proto.graph.output},
            ops=frozenset(_op(node) for node in _all_nodes(proto)),
            external_data=_external_data(proto),
            attention_heads=heads,
            attention_kv_heads=kv_heads,
            embedding_widths=_embedding_widths(proto.graph, inputs, initializers),
            rotary_positions=_rotary_positions(proto.graph, initializers),
            built_for=next(
                (entry.value for entry in proto.metadata_props if entry.key == BUILT_FOR_KEY),
                None,
            ),
        )


#: What names a cross-attention cache (the encoder's keys and values a decoder reads).
CROSS = "cross"


def layer_names(names: Iterable[str], role: str) -> LayerNames | None:
    """The per-layer family among `names` whose role is `role` (one of `cache_roles()`).

    A name's first run of digits is its layer index: "past_key_values.3.key" belongs to the
    family "past_key_values.%d.key". The role is whichever of the roles ends last in the
    pattern ("past_key_values.%d.key" is a key family, "past.%d.conv" a conv family). Returns
    None when no family has the role; raises BundleError when several do. A cross-attention
    family (Whisper's "past_key_cross_%d", computed once by the encoder) gives way to the
    decoder's own cache beside it.
    """
    families: dict[str, list[int]] = {}
    for name in names:
        match = _LAYER_INDEX.search(name)
        if match is None:
            continue
        pattern = f"{name[: match.start()]}%d{name[match.end() :]}"
        families.setdefault(pattern, []).append(int(match.group()))
    found = [pattern for pattern in families if _role(pattern) == role]
    own = [pattern for pattern in found if CROSS not in pattern.lower()]
    found = own or found
    if not found:
        return None
    if len(found) > 1:
        raise BundleError(
            f"graph: several per-layer {role} name families {sorted(found)}; accepted: one, "
            f"like 'past_key_values.%d.{role}'"
        )
    return LayerNames(found[0], tuple(sorted(families[found[0]])))


#: The roles of an attention layer's cache.
KV_ROLES = ("key", "value")


def cache_roles() -> tuple[str, ...]:
    """Cache roles a per-layer name family can have: key and value, and the suffix of every
    state a recurrent block declares (config/recurrent.py); the one whose name ends last in a
    pattern wins (the longer one on a tie: "past_key_values.%d.conv_state" is a conv_state
    family, not a conv one)."""
    return KV_ROLES + state_suffixes()


def _role(pattern: str) -> str | None:
    lowered = pattern.lower()
    found = {
        (lowered.rfind(role) + len(role), len(role)): role
        for role in cache_roles()
        if role in lowered
    }
    return found[max(found)] if found else None


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


def _op(node: onnx.NodeProto) -> str:
    return f"{node.domain or 'ai.onnx'}::{node.op_type}"


def _attention_heads(proto: onnx.ModelProto) -> tuple[frozenset[int], frozenset[int]]:
    """The query and key/value head counts the attention ops' attributes name."""
    import onnx

    heads: set[int] = set()
    kv_heads: set[int] = set()
    for node in _all_nodes(proto):
        names = _HEAD_ATTRIBUTES.get(_op(node))
        if names is None:
            continue
        values = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        for name, found in zip(names, (heads, kv_heads), strict=True):
            if name in values:
                found.add(values[name])
    return frozenset(heads), frozenset(kv_heads)


def _embedding_widths(
    graph: onnx.GraphProto,
    inputs: Mapping[str, TensorSpec],
    initializers: Mapping[str, onnx.TensorProto],
) -> dict[str, frozenset[int]]:
    """Graph input of token ids → widths of the rows gathered with it, from each gather's
    output shape when the graph records it, else from the shape of a plain Gather's table."""
    shapes = {value.name: _spec(value) for value in (*graph.value_info, *graph.output)}
    widths: dict[str, frozenset[int]] = {}
    for node in graph.node:
        position = _GATHER_INDICES.get(_op(node))
        if position is None or len(node.input) <= position or node.input[position] not in inputs:
            continue
        spec = shapes.get(node.output[0])
        width = spec.dim(len(spec.shape) - 1) if spec is not None and spec.shape else None
        table = initializers.get(node.input[0])
        if width is None and _op(node) == "ai.onnx::Gather" and table is not None:
            width = table.dims[-1] if len(table.dims) == 2 else None
        if width is not None:
            ids = node.input[position]
            widths[ids] = widths.get(ids, frozenset()) | {width}
    return widths


def _rotary_positions(
    graph: onnx.GraphProto, initializers: Mapping[str, onnx.TensorProto]
) -> int | None:
    """The fewest positions among the 2-D cos tables [positions, rotary_dim / 2] of the graph."""
    rows = []
    for node in graph.node:
        position = _COS_TABLE_INPUT.get(_op(node))
        if position is None or len(node.input) <= position:
            continue
        table = initializers.get(node.input[position])
        if table is not None and len(table.dims) == 2:
            rows.append(table.dims[0])
    return min(rows, default=None)


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
