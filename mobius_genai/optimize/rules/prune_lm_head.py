"""PruneLmHeadPass: logits of each sequence's last token only, what onnxruntime-genai reads.

onnxruntime-genai samples the next token from the logits of one position per sequence: the last
token that is not padding (it pads batched prompts on the right and finds that token from the
pad id; its attention mask is 0 exactly there). It reads no other row, so a prefill over S prompt
tokens need not run the LM head (a [H, vocab] matmul, ~30% of a small model's prefill) over the
other S-1 rows, nor anything else that works row by row after the last attention.

Math preserved: call the *row-wise tail* the nodes between the last attention and ``logits``
whose output at position s depends only on their activation inputs at position s (matmuls with
a constant weight, norms over the last axis, elementwise ops with constants that have no
sequence axis, ...). For such a tail f and any index vector i (one position per sequence),

    f(x)[b, i[b], :] = f(x[b, i[b], :])

so gathering every activation that enters the tail at i yields exactly those rows of the old
logits, as ``logits`` of shape [batch, 1, vocab]. i[b] is the position of sequence b's last
mask-1 token within this call's S tokens:

    i = clamp(ArgMax(CumSum(attention_mask, axis=1), axis=1) - (total - S), 0, S - 1)

(the cumulative sum first reaches its maximum at the last 1). Left or no padding gives S-1 (the
last position); during decode (one new token) i = 0 and the gather is a copy of one row.

The tail is found backwards from ``logits`` in reverse topological order: a node joins when its
op is in ROW_WISE with the conditions below and every reader of its outputs is in the tail. The
pass declines (and says why in ``kept``) when nothing would be saved or the graph does not look
like a decoder with [batch, sequence, ...] activations and input_ids / attention_mask inputs.

Whether to prune is the caller's choice (the pipeline's ``prune_lm_head`` option, off by
default and in bundles: `package --prune-lm-head`): transformers parity checks, users who score
prompts, and onnxruntime-genai 0.18's og.Engine, n-gram speculative decoding and
``get_output("logits")`` need every position's logits (bundle/og_support.py says why).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai._graph_keys import LAST_TOKEN_KEY
from mobius_genai.components.tier1 import MS_DOMAIN, is_standard_domain

LOGITS = "logits"
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
SEQUENCE_AXIS = 1

#: Ops that act on each position alone, applied along the last axis or elementwise. Values are
#: the input positions that must be constants (weights, scales, biases) rather than activations.
ROW_WISE: dict[tuple[str, str], tuple[int, ...]] = {
    ("", "MatMul"): (1,),
    (MS_DOMAIN, "FusedMatMul"): (1,),
    (MS_DOMAIN, "MatMulNBits"): (1, 2, 3, 4, 5),
    ("", "Add"): (),
    ("", "Sub"): (),
    ("", "Mul"): (),
    ("", "Div"): (),
    ("", "Sigmoid"): (),
    ("", "Tanh"): (),
    ("", "Relu"): (),
    ("", "Erf"): (),
    ("", "Cast"): (),
    ("", "Neg"): (),
    ("", "Softplus"): (),
    ("", "Identity"): (),
    (MS_DOMAIN, "Gelu"): (),
    (MS_DOMAIN, "FastGelu"): (1,),
    (MS_DOMAIN, "QuickGelu"): (),
    (MS_DOMAIN, "BiasGelu"): (1,),
    ("", "Gelu"): (),
    ("", "RMSNormalization"): (1,),
    ("", "LayerNormalization"): (1, 2),
    ("", "SimplifiedLayerNormalization"): (1,),
    (MS_DOMAIN, "SimplifiedLayerNormalization"): (1,),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): (2, 3),
    (MS_DOMAIN, "SkipLayerNormalization"): (2, 3, 4),
}
_NORMS = {"RMSNormalization", "LayerNormalization", "SimplifiedLayerNormalization"}


def _domain(node: ir.Node) -> str:
    return "" if is_standard_domain(node.domain) else node.domain


def _is_constant(value: ir.Value, depth: int = 4) -> bool:
    """An initializer, a Constant, or computed from those alone (a Transpose of a tied
    embedding table, a DequantizeLinear of int4 weights), looking `depth` nodes back."""
    if value.is_initializer():
        return True
    producer = value.producer()
    if producer is None or depth == 0:
        return False
    return all(
        _is_constant(input_value, depth - 1)
        for input_value in producer.inputs
        if input_value is not None
    )


def _has_sequence_axis(value: ir.Value, sequence: object) -> bool:
    """`value` is an activation [batch, sequence, ...] with the graph's sequence dimension."""
    shape = value.shape
    if shape is None or shape.rank() < 3:
        return False
    dim = shape[SEQUENCE_AXIS]
    return not isinstance(dim, int) and dim.value is not None and dim.value == sequence


def _broadcasts_without_sequence(value: ir.Value, rank: int) -> bool:
    """A constant operand of an elementwise op that has no extent along the sequence axis."""
    shape = value.shape
    if shape is None:
        return False
    axis = SEQUENCE_AXIS - (rank - shape.rank())
    return axis < 0 or shape[axis] == 1


class PruneLmHeadPass(ir.passes.InPlacePass):
    """Gather the activations entering the row-wise tail before ``logits`` at the last tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[str] = []
        """Why the graph was left alone (for the trace); empty when it was pruned."""
        self.tail: list[ir.Node] = []
        """The row-wise nodes now computing the last position only."""
        self.matched = 0
        """Activations gathered (the pipeline reports it as the group's matches)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.kept, self.tail, self.matched = [], [], 0
        graph = model.graph
        logits = next((v for v in graph.outputs if v.name == LOGITS), None)
        if logits is None or logits.producer() is None:
            return self._keep(model, f"no graph output {LOGITS!r} computed by a node")
        if logits.shape is None or logits.shape.rank() != 3:
            return self._keep(model, f"{LOGITS!r} is not [batch, sequence, vocab]")
        sequence = logits.shape[SEQUENCE_AXIS]
        if isinstance(sequence, int):
            reason = f"{LOGITS!r} already has {sequence} position(s)"
            return self._keep(model, reason)
        names = {value.name for value in graph.inputs}
        if not {INPUT_IDS, ATTENTION_MASK} <= names:
            reason = f"graph inputs {INPUT_IDS!r} and {ATTENTION_MASK!r} are needed"
            return self._keep(model, reason)
        tail = self._tail(graph, logits, sequence.value)
        if not tail:
            return self._keep(model, f"the node computing {LOGITS!r} does not work row by row")
        entering = self._entering(tail, sequence.value)
        if entering is None:
            return self._keep(model, "an activation entering the LM head is not [batch, seq, ...]")
        self._gather_last(graph, tail, entering)
        self.matched = len(entering)
        for node in tail:
            for output in node.outputs:
                if output.shape is not None and _has_sequence_axis(output, sequence.value):
                    dims = list(output.shape)
                    dims[SEQUENCE_AXIS] = 1
                    output.shape = ir.Shape(dims)
        self.tail = tail
        return ir.passes.PassResult(model, True)

    def _keep(self, model: ir.Model, reason: str) -> ir.passes.PassResult:
        self.kept.append(reason)
        return ir.passes.PassResult(model, False)

    def _tail(self, graph: ir.Graph, logits: ir.Value, sequence: object) -> list[ir.Node]:
        """The row-wise nodes logits depends on through row-wise nodes only (graph order)."""
        root = logits.producer()
        if not self._row_wise(root, sequence):
            return []
        members: set[ir.Node] = {root}
        for node in reversed(list(graph)):
            if node is root or node in members:
                continue
            uses = [(user, index) for output in node.outputs for user, index in output.uses()]
            if (
                uses
                and not any(output.is_graph_output() for output in node.outputs)
                and all(user in members for user, _ in uses)
                and self._row_wise(node, sequence)
            ):
                members.add(node)
        return [node for node in graph if node in members]

    @staticmethod
    def _row_wise(node: ir.Node, sequence: object) -> bool:
        constants = ROW_WISE.get((_domain(node), node.op_type))
        if constants is None or node.graph is None:
            return False
        output = node.outputs[0]
        if not _has_sequence_axis(output, sequence):
            return False
        rank = output.shape.rank()
        if node.op_type in _NORMS and node.attributes.get_int("axis", -1) not in (-1, rank - 1):
            return False
        if node.op_type == "FusedMatMul" and any(
            node.attributes.get_int(name, 0) for name in ("transA", "transBatchA", "transBatchB")
        ):
            return False
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if index in constants:
                if not _is_constant(value):
                    return False
            elif _is_constant(value):
                if not _broadcasts_without_sequence(value, rank):
                    return False
            elif not _has_sequence_axis(value, sequence) or value.shape.rank() != rank:
                return False
        return True

    @staticmethod
    def _entering(tail: list[ir.Node], sequence: object) -> list[ir.Value] | None:
        """Activations read by the tail and computed outside it (None if one is not [b, s, ..])."""
        members = set(tail)
        entering: list[ir.Value] = []
        for node in tail:
            for value in node.inputs:
                if value is None or _is_constant(value) or value in entering:
                    continue
                if value.producer() in members:
                    continue
                if not _has_sequence_axis(value, sequence):
                    return None
                entering.append(value)
        return entering

    @staticmethod
    def _gather_last(graph: ir.Graph, tail: list[ir.Node], entering: list[ir.Value]) -> None:
        """Replace each entering activation, for the tail, by its rows at the last tokens."""
        members = set(tail)
        index, index_nodes = _last_token_index(graph)
        anchor = next(iter(graph))
        for node in index_nodes:
            graph.insert_before(anchor, node)
        for value in entering:
            node = ir.node(
                "GatherND",
                [value, index],
                attributes={"batch_dims": 1},
                name=f"prune_lm_head/GatherND_{value.name}",
            )
            node.metadata_props[LAST_TOKEN_KEY] = "1"
            last = node.outputs[0]
            last.name = f"{value.name}_last_token"
            last.dtype = value.dtype
            dims = list(value.shape)
            dims[SEQUENCE_AXIS] = 1
            last.shape = ir.Shape(dims)
            for user, position in list(value.uses()):
                if user in members:
                    user.replace_input_with(position, last)
            producer = value.producer()
            if producer is None:  # a graph input
                graph.insert_after(index_nodes[-1], node)
            else:
                graph.insert_after(producer, node)


def _last_token_index(graph: ir.Graph) -> tuple[ir.Value, list[ir.Node]]:
    """[batch, 1, 1] int64: each sequence's last mask-1 position among this call's tokens."""
    inputs = {value.name: value for value in graph.inputs}
    mask, input_ids = inputs[ATTENTION_MASK], inputs[INPUT_IDS]
    one = _constant(graph, "prune_lm_head_one", [1])
    zero = _constant(graph, "prune_lm_head_zero", [0])
    axis2 = _constant(graph, "prune_lm_head_axis2", [2])
    nodes: list[ir.Node] = []

    def add(op_type: str, inputs: list[ir.Value], **attributes: int) -> ir.Value:
        name = f"prune_lm_head/{op_type}_{len(nodes)}"
        node = ir.node(op_type, inputs, attributes=attributes, name=name)
        nodes.append(node)
        return node.outputs[0]

    counts = add("CumSum", [mask, _constant(graph, "prune_lm_head_axis1", 1)])
    last_one = add("ArgMax", [counts], axis=1, keepdims=1)  # [batch, 1]
    total = add("Shape", [mask], start=1, end=2)
    sequence = add("Shape", [input_ids], start=1, end=2)
    index = add("Add", [add("Sub", [last_one, total]), sequence])
    index = add("Min", [add("Max", [index, zero]), add("Sub", [sequence, one])])
    index = add("Unsqueeze", [index, axis2])  # [batch, 1, 1]
    index.name = "prune_lm_head_last_token_index"
    index.dtype = ir.DataType.INT64
    index.shape = ir.Shape([mask.shape[0] if mask.shape is not None else None, 1, 1])
    return index, nodes


def _constant(graph: ir.Graph, name: str, values: list[int] | int) -> ir.Value:
    unique, suffix = name, 1
    while unique in graph.initializers:
        unique, suffix = f"{name}_{suffix}", suffix + 1
    tensor = ir.tensor(np.array(values, dtype=np.int64), name=unique)
    value = ir.Value(name=unique, shape=tensor.shape, type=ir.TensorType(ir.DataType.INT64))
    value.const_value = tensor
    graph.register_initializer(value)
    return value
