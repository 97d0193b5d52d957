"""PackQKVSplitPass: q/k/v projections that reach GQA through ops of their own (q/k norms) →
one packed projection and a Split.

Math preserved: for weights stored [in, out] (components/linear.py),

    Split(x @ [Wq | Wk | Wv], [q, k, v widths], axis=-1) = (x @ Wq, x @ Wk, x @ Wv)

column by column, so the three Split outputs replace the three projection outputs exactly, and
whatever each projection's output went through before GroupQueryAttention (gemma3's and
qwen3's per-head q/k RMSNorm with its Reshapes, olmo2's whole-projection norm) stays as it was,
now after the Split. This is PackQKV (pack_qkv.py) for the layers it cannot take: there the
packed output feeds GQA directly, here the ops between the projections and GQA need the three
parts separately. onnxruntime-genai's builder packs these layers the same way.

A projection is found by walking back from GQA's query, key and value inputs through nodes
that read one activation (their first input) and constants otherwise, to a MatMul with an
initializer weight. Such a node may have other outputs (Qwen3.5's Split of each head's
[q_h | gate_h] into the query and the output gate): whatever reads the projection's output
reads the same columns of the packed one. The pass declines (reasons in ``kept``, for the
trace) when the three do not read the same input or their weights cannot be concatenated. The
packed weight is a ``ConcatTensor`` as in PackQKV (nothing read at rewrite time; INT4 quantizes
the parts one by one); the unused q/k/v initializers are left for the pipeline's final cleanup.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.optimize.rules.gqa import GQA_OP, KEY, MS_DOMAIN, QUERY, VALUE
from mobius_genai.optimize.rules.pack_qkv import concat_parameter, new_parameter

#: Steps walked back from a GQA input before giving up on finding its projection.
MAX_STEPS = 8


def _is_constant(value: ir.Value | None) -> bool:
    if value is None or value.is_initializer():
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant"


def _projection(value: ir.Value | None) -> ir.Node | None:
    """The MatMul(x, W) whose output reaches `value` through per-projection nodes only."""
    for _ in range(MAX_STEPS):
        node = value.producer() if value is not None else None
        if node is None or not node.inputs:
            return None
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
            return node if node.inputs[1] is not None and node.inputs[1].is_initializer() else None
        if not all(_is_constant(other) for other in node.inputs[1:]):
            return None
        value = node.inputs[0]
    return None


def _check(projections: list[ir.Node | None]) -> str | None:
    """Why the three projections cannot be packed, or None."""
    if any(node is None for node in projections):
        return "a q/k/v input is not a MatMul with an initializer weight behind per-projection ops"
    if len(set(projections)) != 3:
        return "q/k/v inputs share a projection"
    if len({node.inputs[0] for node in projections}) != 1:
        return "q/k/v projections read different inputs"
    weights = [node.inputs[1] for node in projections]
    for w in weights:
        if w.shape is None or len(w.shape) != 2 or not all(isinstance(d, int) for d in w.shape):
            return f"projection weight {w.name} is not 2-D with a static shape"
    if len({w.shape[0] for w in weights}) != 1 or len({w.dtype for w in weights}) != 1:
        return "q/k/v weights differ in input width or dtype"
    if len({w.const_value is None for w in weights}) != 1:
        return "some q/k/v weights have values and some do not"
    return None


class PackQKVSplitPass(ir.passes.InPlacePass):
    """Pack each GQA's q/k/v projections into one MatMul followed by a Split."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[str] = []
        """Why a GQA's projections were left alone (for the trace)."""
        self.matched = 0
        """Layers packed (the pipeline reports it as the group's matches)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.kept, self.matched = [], 0
        graph = model.graph
        order = {node: index for index, node in enumerate(graph)}
        for node in list(graph):
            if node.op_type != GQA_OP or node.domain != MS_DOMAIN or node.inputs[KEY] is None:
                continue  # not GQA, or q/k/v already packed
            projections = [_projection(node.inputs[i]) for i in (QUERY, KEY, VALUE)]
            reason = _check(projections)
            if reason is not None:
                self.kept.append(f"{node.name}: {reason}")
                continue
            _pack(graph, sorted(projections, key=order.__getitem__), projections)
            self.matched += 1
        return ir.passes.PassResult(model, self.matched > 0)


def _pack(graph: ir.Graph, in_graph_order: list[ir.Node], projections: list[ir.Node]) -> None:
    """Replace the q, k, v MatMuls (`projections`) by MatMul(x, [Wq | Wk | Wv]) and a Split of
    its output, placed before the first of them."""
    x = projections[0].inputs[0]
    weights = [node.inputs[1] for node in projections]
    dtype = weights[0].dtype
    packed_w = concat_parameter(graph, weights, axis=1, dtype=dtype, suffix=".weight")
    widths = [int(w.shape[1]) for w in weights]
    sizes = new_parameter(
        graph,
        f"{packed_w.name}.split",
        [3],
        ir.DataType.INT64,
        lambda name: ir.tensor(np.array(widths, dtype=np.int64), name=name),
    )
    prefix = (projections[0].name or packed_w.name).rsplit("/q_proj", 1)[0]
    matmul = ir.node("MatMul", [x, packed_w], name=f"{prefix}/qkv_proj/MatMul")
    packed = matmul.outputs[0]
    packed.name, packed.type = f"{packed_w.name}.output", x.type
    if x.shape is not None:
        packed.shape = ir.Shape([*x.shape[:-1], sum(widths)])
    split = ir.node(
        "Split", [packed, sizes], attributes={"axis": -1}, num_outputs=3, name=f"{prefix}/qkv_split"
    )
    graph.insert_before(in_graph_order[0], [matmul, split])
    for old, new in zip(projections, split.outputs, strict=True):
        value = old.outputs[0]
        new.name, new.type, new.shape = f"{value.name}.split", value.type, value.shape
    olds = [node.outputs[0] for node in projections]
    ir.convenience.replace_all_uses_with(olds, list(split.outputs), replace_graph_outputs=True)
    graph.remove(projections, safe=True)
