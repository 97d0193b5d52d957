"""Activation statistics for the int4 search: each input feature's mean square at every
quantized MatMul, over random token ids pushed through the float graph (AWQ-style importance).

No tokenizer, no data, nothing from the checkpoint executed: `Calibration.tokens` random ids
(fixed seed) go through the decoder graph in onnxruntime (CPU) with an empty KV cache. The
graph runs a chunk of nodes at a time, in graph order: a chunk's weights (at most
`chunk_bytes`, or one larger weight alone) are read from their lazy tensors, fed to the chunk
as inputs (no copy in a model proto, no prepacked copy) and dropped after it; activations are
kept only until the last chunk that reads them. Only the nodes the statistics need run (not
the lm_head's MatMul, whose input is the last one needed), and the token embedding lookup
reads only the rows of the ids (numpy). The run computes in float32 whatever the graph's float
type: onnxruntime's CPU provider has no bfloat16 MatMul and is slow in float16, and the
statistics are the same up to rounding. A pruned LM head (`PruneLmHeadPass`) is measured over
every position, as in the unpruned graph: its last-token gathers pass all rows through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from mobius_genai._graph_keys import CONTEXT_LENGTH_KEY, LAST_TOKEN_KEY
from mobius_genai.checkpoint.experts import ExpertsTensor
from mobius_genai.checkpoint.weights import CheckpointTensor
from mobius_genai.ep import HOST_EP, get_ep
from mobius_genai.errors import ConfigError
from mobius_genai.progress import item_part

__all__ = [
    "CALIBRATION_CHUNK_BYTES",
    "Calibration",
    "activation_importance",
    "calibration_refusal",
    "within_context",
]

#: Most bytes of weights one chunk of the calibration run reads (with 256 MiB the chunk's
#: weights were most of the Qwen2.5-0.5B shape's 782 MiB peak; 64 MiB: 435 MiB, +1 s of CPU).
CALIBRATION_CHUNK_BYTES = 64 << 20

#: Initializers up to this size stay in the chunk's model (shapes and constants that ops or
#: onnxruntime's shape inference want constant); larger ones are fed as inputs.
_INLINE_BYTES = 1 << 16

_TOKEN_IDS = "input_ids"
_LOGITS = "logits"
#: A vision-language decoder's input: its embeddings come from another graph.
_EMBEDDINGS = "inputs_embeds"

#: The float types the run computes in float32 instead (`_as_float32`).
_NARROW_FLOATS = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The random token ids the statistics are measured over (256: SmolLM2's KL as with 512,
    0.483x against 0.485x the builder's, in half the run; benchmarks/README.md, "The int4
    search's speed")."""

    tokens: int = 256
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
        _keep_shared_weights(graph, nodes, index, last_use, store)
        produced = {out for node in nodes for out in node.outputs}
        outputs = [v for v in produced if last_use.get(v, -1) > index or v in wanted]
        store.update(_run_chunk(model, nodes, outputs, store))
        _accumulate(sums, store, wanted)
        for value in [v for v in store if last_use.get(v, -1) <= index]:
            del store[value]
        item_part(index + 1, len(chunks))
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


def calibration_refusal(graph: ir.Graph) -> str | None:
    """Why random token ids cannot be pushed through `graph` (None when they can): it must look
    them up itself (not a vision-language decoder taking `inputs_embeds`), have a fixed
    vocabulary size, and hold no stacked MoE experts (the run would read a layer's experts at
    once, while saving streams them one by one)."""
    names = {value.name for value in graph.inputs}
    if _TOKEN_IDS not in names or _EMBEDDINGS in names:
        return f"the graph takes {_EMBEDDINGS!r} rather than looking up {_TOKEN_IDS!r}"
    if _vocabulary(graph) is None:
        return f"the graph output {_LOGITS!r} has no fixed vocabulary size"
    if any(isinstance(value.const_value, ExpertsTensor) for value in graph.initializers.values()):
        return "its MoE experts would be read a whole layer at a time"
    return None


def within_context(model: ir.Model, calibration: Calibration) -> Calibration:
    """`calibration` with at most as many tokens as the positions `model` was built for (its
    metadata says; a longer prefill would run past its rotary tables)."""
    context = model.metadata_props.get(CONTEXT_LENGTH_KEY)
    if context is None or int(context) >= calibration.tokens:
        return calibration
    return dataclasses.replace(calibration, tokens=int(context))


def _decoder_feeds(graph: ir.Graph, calibration: Calibration) -> dict[ir.Value, np.ndarray]:
    """Graph inputs for one prefill of the random ids: an empty cache, batch 1 (as
    onnxruntime-genai feeds a decoder)."""
    vocab = _vocabulary(graph)
    refusal = calibration_refusal(graph)
    if refusal is not None or vocab is None:
        raise ConfigError(
            f"calibrated int4 recipes run random token ids through the decoder graph, but "
            f"{refusal}; graph inputs: {', '.join(str(v.name) for v in graph.inputs)}"
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
        elif value.const_value is not None:  # an input with a default (LoRA's, empty): as is
            array = value.const_value.numpy()
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
    """An initializer fed to a chunk as an input (read only for that chunk): a large one, or
    one read lazily (from the checkpoint: its read checks, e.g. for NaN, raise their own
    errors)."""
    tensor = value.const_value
    return _initializer(value) and (
        tensor.nbytes > _INLINE_BYTES or isinstance(tensor, ir.LazyTensor)  # type: ignore[union-attr]
    )


def _chunks(graph: ir.Graph, nodes: list[ir.Node], budget: int) -> list[list[ir.Node]]:
    """`nodes` cut, in order, into runs whose weights total at most `budget` bytes (or one
    node with more)."""
    chunks: list[list[ir.Node]] = []
    current: list[ir.Node] = []
    weights: set[ir.Value] = set()
    for node in nodes:
        new = {value for value in _reads(graph, node) if _initializer(value)} - weights
        size = sum(_run_bytes(value) for value in weights | new)
        if current and size > budget:
            chunks.append(current)
            current, weights = [], set()
            new = {value for value in _reads(graph, node) if _initializer(value)}
        current.append(node)
        weights |= new
    if current:
        chunks.append(current)
    return chunks


def _keep_shared_weights(
    graph: ir.Graph,
    nodes: list[ir.Node],
    index: int,
    last_use: dict[ir.Value, int],
    store: dict[ir.Value, np.ndarray],
) -> None:
    """Read into `store` the weights chunk `index` shares with later chunks (the rope tables
    every layer reads: a lazy table is computed again on each read, 48 times for the
    Qwen2.5-0.5B shape), so that they are read once and dropped after their last chunk."""
    for node in nodes:
        for value in _reads(graph, node):
            if value not in store and _weight(value) and last_use.get(value, -1) > index:
                store[value] = value.const_value.numpy()  # type: ignore[union-attr]


def _run_bytes(value: ir.Value) -> int:
    """The bytes of an initializer as the run holds it (float32 for a narrower float)."""
    tensor = value.const_value
    assert tensor is not None
    narrow = tensor.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    return tensor.nbytes * (2 if narrow else 1)


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
    proto = _every_position(_as_float32(ir.to_proto(chunk)))
    feeds = {value: _float32(array) for value, array in feeds.items()}
    proto.graph.input.extend(
        onnx.helper.make_tensor_value_info(
            value.name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
        )
        for value, array in feeds.items()
    )
    proto.graph.output.extend(onnx.ValueInfoProto(name=value.name) for value in outputs)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.log_severity_level = 3  # errors only
    try:
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=[get_ep(HOST_EP).runtime.ort_provider]
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


def _every_position(proto: onnx.ModelProto) -> onnx.ModelProto:
    """`proto` with its last-token gathers (LAST_TOKEN_KEY) passing every position through
    (Identity), and no value types that would still say one position."""
    for node in proto.graph.node:
        if any(entry.key == LAST_TOKEN_KEY for entry in node.metadata_props):
            node.op_type, node.domain = "Identity", ""
            del node.input[1:]
            node.ClearField("attribute")
    proto.graph.ClearField("value_info")
    return proto


def _float32(array: np.ndarray) -> np.ndarray:
    """A float16 or bfloat16 array in float32; any other array as it is."""
    narrow = onnx.helper.np_dtype_to_tensor_dtype(array.dtype) in _NARROW_FLOATS
    return array.astype(np.float32) if narrow else array


def _as_float32(proto: onnx.ModelProto) -> onnx.ModelProto:
    """`proto` computing in float32 where it names float16 or bfloat16: its initializers, the
    tensors and target types of its nodes' attributes (Constant, ConstantOfShape, Cast...) and
    its values' types, in the graph, its subgraphs and its functions."""
    graphs = [proto.graph]
    nodes = [node for function in proto.functions for node in function.node]
    infos = [info for function in proto.functions for info in function.value_info]
    while graphs:
        graph = graphs.pop()
        tensors = list(graph.initializer)
        graph.ClearField("initializer")
        graph.initializer.extend(_tensor_float32(tensor) for tensor in tensors)
        infos.extend([*graph.input, *graph.output, *graph.value_info])
        nodes.extend(graph.node)
        for node in graph.node:
            for attribute in node.attribute:
                graphs.extend([attribute.g] if attribute.HasField("g") else attribute.graphs)
    for node in nodes:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.INT and attribute.i in _NARROW_FLOATS:
                if attribute.name in ("to", "dtype", "output_dtype"):
                    attribute.i = onnx.TensorProto.FLOAT
            elif attribute.type == onnx.AttributeProto.TENSOR:
                attribute.t.CopyFrom(_tensor_float32(attribute.t))
    for info in infos:
        if info.type.tensor_type.elem_type in _NARROW_FLOATS:
            info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return proto


def _tensor_float32(tensor: onnx.TensorProto) -> onnx.TensorProto:
    if tensor.data_type not in _NARROW_FLOATS:
        return tensor
    array = onnx.numpy_helper.to_array(tensor).astype(np.float32)
    return onnx.numpy_helper.from_array(array, tensor.name)


def _accumulate(
    sums: dict[ir.Value, list], store: dict[ir.Value, np.ndarray], wanted: set[ir.Value]
) -> None:
    """Add each newly available wanted value's per-feature sum of squares and row count."""
    for value in wanted & store.keys() - sums.keys():
        array = store[value]
        rows = array.reshape(-1, array.shape[-1]).astype(np.float64)
        sums[value] = [np.einsum("ij,ij->j", rows, rows), rows.shape[0]]
