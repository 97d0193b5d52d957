"""Activation statistics for the int4 search: each input feature's mean square at every
quantized MatMul, over random token ids pushed through the float graph (AWQ-style importance).

No tokenizer, no data, nothing from the checkpoint executed: `Calibration.tokens` random ids
(fixed seed) go through the decoder graph in onnxruntime (CPU) with an empty KV cache. The
graph runs a chunk of nodes at a time, in graph order: a chunk's weights (at most
`chunk_bytes`, or one larger weight alone) are read from their lazy tensors, fed to the chunk
as inputs (no copy in a model proto, no prepacked copy) and dropped after it; activations are
kept only until the last chunk that reads them. Only the nodes the statistics need run (not
the lm_head's MatMul, whose input is the last one needed), and the token embedding lookup
reads only the rows of the ids (numpy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from mobius_genai.ep import get_ep
from mobius_genai.errors import ConfigError
from mobius_genai.weights import CheckpointTensor

__all__ = ["CALIBRATION_CHUNK_BYTES", "Calibration", "activation_importance", "calibrates"]

#: Most bytes of weights one chunk of the calibration run reads.
CALIBRATION_CHUNK_BYTES = 256 << 20

#: Initializers up to this size stay in the chunk's model (shapes and constants that ops or
#: onnxruntime's shape inference want constant); larger ones are fed as inputs.
_INLINE_BYTES = 1 << 16

_TOKEN_IDS = "input_ids"
_LOGITS = "logits"
#: A vision-language decoder's input: its embeddings come from another graph.
_EMBEDDINGS = "inputs_embeds"


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The random token ids the statistics are measured over."""

    tokens: int = 512
    seed: int = 0


def activation_importance(
    model: ir.Model,
    targets: Sequence[Sequence[ir.Value]],
    calibration: Calibration,
    chunk_bytes: int = CALIBRATION_CHUNK_BYTES,
) -> list[np.ndarray | None]:
    """For each entry of `targets` (the A inputs of one weight's MatMuls), the mean square of
    each feature (last axis) over every row of all of them, float32 [K]; None for no inputs.

    Raises ConfigError when the graph takes no `input_ids` or cannot run in onnxruntime."""
    graph = model.graph
    store = _decoder_feeds(graph, calibration)
    store.update(_lookups(store))
    wanted = {value for values in targets for value in values}
    sums: dict[ir.Value, list] = {}
    _accumulate(sums, store, wanted)
    chunks = _chunks(graph, _needed_nodes(graph, wanted, store.keys()), chunk_bytes)
    last_use = _last_uses(graph, chunks)
    for index, nodes in enumerate(chunks):
        produced = {out for node in nodes for out in node.outputs}
        outputs = [v for v in produced if last_use.get(v, -1) > index or v in wanted]
        store.update(_run_chunk(model, nodes, outputs, store))
        _accumulate(sums, store, wanted)
        for value in [v for v in store if last_use.get(v, -1) <= index]:
            del store[value]
    results: list[np.ndarray | None] = []
    for values in targets:
        totals = [sums[value] for value in values if value in sums]
        if not totals:
            results.append(None)
            continue
        square = sum(total[0] for total in totals)
        rows = sum(total[1] for total in totals)
        results.append((square / rows).astype(np.float32))
    return results


def calibrates(graph: ir.Graph) -> bool:
    """Whether random token ids can be pushed through `graph`: it looks them up itself (not a
    vision-language decoder taking `inputs_embeds`) and has a fixed vocabulary size."""
    names = {value.name for value in graph.inputs}
    return _TOKEN_IDS in names and _EMBEDDINGS not in names and _vocabulary(graph) is not None


def _decoder_feeds(graph: ir.Graph, calibration: Calibration) -> dict[ir.Value, np.ndarray]:
    """Graph inputs for one prefill of the random ids: an empty cache, batch 1 (as
    onnxruntime-genai feeds a decoder)."""
    vocab = _vocabulary(graph)
    if not calibrates(graph) or vocab is None:
        raise ConfigError(
            f"calibrated int4 recipes need a decoder with the graph input {_TOKEN_IDS!r} (and "
            f"no {_EMBEDDINGS!r}) and a fixed vocabulary size (the last dimension of "
            f"{_LOGITS!r}); graph inputs: {', '.join(str(v.name) for v in graph.inputs)}"
        )
    tokens = calibration.tokens
    rng = np.random.default_rng(calibration.seed)
    feeds = {}
    for value in graph.inputs:
        dtype = np.dtype(value.dtype.numpy())  # type: ignore[union-attr]
        if value.name == _TOKEN_IDS:
            array = rng.integers(0, vocab, size=(1, tokens)).astype(dtype)
        elif value.name == "attention_mask":
            array = np.ones((1, tokens), dtype)
        elif value.name == "position_ids":
            array = np.arange(tokens, dtype=dtype)[None]
        else:  # past state: batch 1, nothing cached
            dims = list(value.shape or ())
            shape = [d if isinstance(d, int) else (1 if i == 0 else 0) for i, d in enumerate(dims)]
            array = np.zeros(shape, dtype)
        feeds[value] = array
    return feeds


def _vocabulary(graph: ir.Graph) -> int | None:
    """The vocabulary size: the last dimension of the logits output (None where unknown)."""
    for value in graph.outputs:
        dims = list(value.shape or ())
        if value.name == _LOGITS and dims and isinstance(dims[-1], int):
            return dims[-1]
    return None


def _reads(graph: ir.Graph, node: ir.Node) -> Iterator[ir.Value]:
    """The values of `graph` that `node` reads, also from inside its subgraphs."""
    yield from (value for value in node.inputs if value is not None)
    for attribute in node.attributes.values():
        subgraphs = (
            [attribute.value]
            if attribute.type == ir.AttributeType.GRAPH
            else attribute.value
            if attribute.type == ir.AttributeType.GRAPHS
            else []
        )
        for subgraph in subgraphs:
            for inner in ir.traversal.RecursiveGraphIterator(subgraph):
                yield from (v for v in inner.inputs if v is not None and v.graph is graph)


def _lookups(feeds: dict[ir.Value, np.ndarray]) -> dict[ir.Value, np.ndarray]:
    """The outputs of the embedding lookups (Gather, axis 0, of an initializer table) of the
    fed ids, from the rows they pick: a large table is never read whole."""
    found = {}
    for value, ids in feeds.items():
        for use in value.uses():
            node, table = use.node, use.node.inputs[0]
            if (
                (node.domain, node.op_type, use.idx) == ("", "Gather", 1)
                and table is not None
                and _initializer(table)
                and node.attributes.get_int("axis", 0) == 0
            ):
                found[node.outputs[0]] = _rows(table.const_value, ids)  # type: ignore[arg-type]
    return found


def _rows(tensor: ir.TensorProtocol, ids: np.ndarray) -> np.ndarray:
    """table[ids], reading only the rows `ids` picks from a checkpoint's table."""
    unique, inverse = np.unique(ids, return_inverse=True)
    if isinstance(tensor, CheckpointTensor) and not tensor.transposed:
        rows = np.concatenate([tensor.stored_rows(int(i), int(i) + 1) for i in unique])
    else:
        rows = tensor.numpy()[unique]
    return rows[inverse.reshape(ids.shape)]


def _needed_nodes(
    graph: ir.Graph, wanted: set[ir.Value], known: Collection[ir.Value]
) -> list[ir.Node]:
    """The nodes that compute `wanted` from the `known` values, in graph order."""
    needed: set[ir.Node] = set()
    stack = list(wanted)
    while stack:
        value = stack.pop()
        producer = None if value in known else value.producer()
        if producer is None or producer in needed:
            continue
        needed.add(producer)
        stack.extend(_reads(graph, producer))
    return [node for node in graph if node in needed]


def _initializer(value: ir.Value) -> bool:
    return value.is_initializer() and value.const_value is not None


def _weight(value: ir.Value) -> bool:
    """An initializer fed to a chunk as an input (read only for that chunk)."""
    return _initializer(value) and value.const_value.nbytes > _INLINE_BYTES  # type: ignore[union-attr]


def _chunks(graph: ir.Graph, nodes: list[ir.Node], budget: int) -> list[list[ir.Node]]:
    """`nodes` cut, in order, into runs whose weights total at most `budget` bytes (or one
    node with more)."""
    chunks: list[list[ir.Node]] = []
    current: list[ir.Node] = []
    weights: set[ir.Value] = set()
    for node in nodes:
        new = {value for value in _reads(graph, node) if _initializer(value)} - weights
        size = sum(value.const_value.nbytes for value in weights | new)  # type: ignore[union-attr]
        if current and size > budget:
            chunks.append(current)
            current, weights = [], set()
            new = {value for value in _reads(graph, node) if _initializer(value)}
        current.append(node)
        weights |= new
    if current:
        chunks.append(current)
    return chunks


def _last_uses(graph: ir.Graph, chunks: list[list[ir.Node]]) -> dict[ir.Value, int]:
    """Each value read by a chunk -> the index of the last chunk reading it."""
    return {
        value: index
        for index, nodes in enumerate(chunks)
        for n in nodes
        for value in _reads(graph, n)
    }


def _run_chunk(
    model: ir.Model,
    nodes: list[ir.Node],
    outputs: list[ir.Value],
    store: dict[ir.Value, np.ndarray],
) -> dict[ir.Value, np.ndarray]:
    """Run `nodes` in onnxruntime; their inputs come from `store` or, for weights, from the
    initializers' (lazy) tensors, read now and released on return."""
    graph = model.graph
    produced = {out for node in nodes for out in node.outputs}
    reads = dict.fromkeys(v for node in nodes for v in _reads(graph, node) if v not in produced)
    feeds: dict[ir.Value, np.ndarray] = {}
    inline = []
    for value in reads:
        if value in store:
            feeds[value] = store[value]
        elif _weight(value):
            feeds[value] = value.const_value.numpy()  # type: ignore[union-attr]
        elif value.is_initializer():
            inline.append(value)
    # inputs typed from their arrays, outputs by name only: intermediate values may carry no
    # type in the graph (onnxruntime infers it)
    view = ir.GraphView([], [], nodes=nodes, initializers=inline, opset_imports=graph.opset_imports)
    chunk = ir.Model(view, ir_version=model.ir_version, functions=model.functions.values())  # type: ignore[arg-type]
    proto = ir.to_proto(chunk)
    proto.graph.input.extend(
        onnx.helper.make_tensor_value_info(
            value.name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
        )
        for value, array in feeds.items()
    )
    proto.graph.output.extend(onnx.ValueInfoProto(name=value.name) for value in outputs)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.log_severity_level = 3  # errors only: fp16 graphs warn about constant folding
    try:
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=[get_ep("cpu").runtime.ort_provider]
        )
        arrays = session.run(
            [value.name for value in outputs], {v.name: a for v, a in feeds.items()}
        )
    except Exception as error:  # onnxruntime raises its own types
        raise ConfigError(
            f"calibrated int4 recipes run the float graph in onnxruntime (CPU), which failed on "
            f"nodes {nodes[0].name!r}..{nodes[-1].name!r}: {str(error).splitlines()[0]}; "
            "choose a recipe without calibration (--int4-quality)"
        ) from None
    return dict(zip(outputs, arrays, strict=True))


def _accumulate(
    sums: dict[ir.Value, list], store: dict[ir.Value, np.ndarray], wanted: set[ir.Value]
) -> None:
    """Add each newly available wanted value's per-feature sum of squares and row count."""
    for value in wanted & store.keys() - sums.keys():
        array = store[value]
        rows = array.reshape(-1, array.shape[-1]).astype(np.float64)
        sums[value] = [np.einsum("ij,ij->j", rows, rows), rows.shape[0]]
