"""PackQKV: three q/k/v projections of one input → one packed projection feeding GQA.

Math preserved: for weights stored [in, out] (components/linear.py),

    concat(x @ Wq + bq, x @ Wk + bk, x @ Wv + bv, axis=-1) = x @ [Wq | Wk | Wv] + [bq | bk | bv]

with a LoRA branch on each projection (components/lora.py: ``y = x @ W [+ b] + d``, the
delta ``d = (x @ A) @ B`` of graph inputs A, B) the deltas are concatenated the same way and
added after the packed projection, so the base weights still pack (and quantize) as one::

    concat(x @ Wq + dq, x @ Wk + dk, x @ Wv + dv) = x @ [Wq | Wk | Wv] + concat(dq, dk, dv)

and GroupQueryAttention reads a packed query of width ``(num_heads + 2 * kv_num_heads) *
head_dim`` as exactly that concatenation (key and value inputs left empty).

The packed weight is a new initializer whose value is a `ConcatTensor` (an ``ir.LazyTensor``)
that concatenates the three weights only when it is read: nothing is read at rewrite time,
and INT4 quantization reads the parts one by one. Built without weights
(``load_weights=False``) the three parameters have no value and neither does the packed one.
The unused q/k/v initializers are left for the pipeline's final cleanup.

Gating on the model dtype (``qkv_pack_dtypes``) is the pipeline's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.checkpoint.weights import ConcatTensor
from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules.gqa import GQA_OP, MS_DOMAIN, PAST_KEY


def new_parameter(
    graph: ir.Graph,
    name: str,
    shape: Sequence[int],
    dtype: ir.DataType,
    make_value: Callable[[str], ir.TensorProtocol] | None,
) -> ir.Value:
    """Register an initializer under an unused name derived from `name`.

    `make_value` returns the tensor for the final name; None makes a parameter without a
    value (a graph built without weights).
    """
    unique, suffix = name, 1
    while unique in graph.initializers:
        unique, suffix = f"{name}_{suffix}", suffix + 1
    value = ir.Value(name=unique, shape=ir.Shape(shape), type=ir.TensorType(dtype))
    if make_value is not None:
        value.const_value = make_value(unique)
    graph.initializers.add(value)  # (register_initializer insists on a value)
    return value


def _packed_name(q_name: str, suffix: str) -> str:
    if "q_proj" in q_name:
        return q_name.replace("q_proj", "qkv_proj")
    return f"{q_name}.qkv{suffix}"


class PackQKV(RecordingRuleClassBase):
    """GQA(MatMul(x, Wq) [+ bq], MatMul(x, Wk) [+ bk], MatMul(x, Wv) [+ bv]) → packed GQA."""

    def __init__(self, bias: bool, lora: bool = False) -> None:
        super().__init__("PackQKV")
        self.bias = bias
        self.lora = lora

    def pattern(self, op, x, wq, wk, wv, bq, bk, bv, dq, dk, dv):
        q, k, v = op.MatMul(x, wq), op.MatMul(x, wk), op.MatMul(x, wv)
        if self.bias:
            q, k, v = op.Add(q, bq), op.Add(k, bk), op.Add(v, bv)
        if self.lora:
            q, k, v = op.Add(q, dq), op.Add(k, dk), op.Add(v, dv)
        return op.GroupQueryAttention(
            q,
            k,
            v,
            _domain=MS_DOMAIN,
            _allow_other_inputs=True,
            _allow_other_attributes=True,
            _outputs=["attention", "present_key", "present_value"],
        )

    def check(
        self, context, wq, wk, wv, attention, bq=None, bk=None, bv=None, **parts
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        weights = (wq, wk, wv)
        for w in weights:
            if not w.is_initializer() or w.shape is None or len(w.shape) != 2:
                return result.fail("projection weight is not a 2-D initializer", w)
            if not all(isinstance(d, int) for d in w.shape):
                return result.fail("projection weight has a symbolic shape", w)
        if len({w.shape[0] for w in weights}) != 1 or len({w.dtype for w in weights}) != 1:
            return result.fail("q/k/v weights differ in input width or dtype", list(weights))
        if wk.shape[1] != wv.shape[1]:
            return result.fail("key and value widths differ", [wk, wv])
        gqa = attention.producer().attributes
        num_heads, kv_num_heads = gqa.get_int("num_heads", 0), gqa.get_int("kv_num_heads", 0)
        if num_heads <= 0 or wq.shape[1] * kv_num_heads != wk.shape[1] * num_heads:
            return result.fail(
                "q and k/v widths do not give one head_dim for num_heads/kv_num_heads, which "
                "GQA needs to split a packed input",
                attention.producer(),
            )
        if len({w.const_value is None for w in weights}) != 1:
            return result.fail("some q/k/v weights have values and some do not", list(weights))
        if self.bias:
            for b, w in zip((bq, bk, bv), weights, strict=True):
                if not b.is_initializer() or b.shape is None or list(b.shape) != [w.shape[1]]:
                    return result.fail("projection bias is not a 1-D initializer of its width", b)
                if b.dtype != w.dtype or (b.const_value is None) != (w.const_value is None):
                    return result.fail("projection bias and weight disagree", b)
        if self.lora:
            deltas = (parts["dq"], parts["dk"], parts["dv"])
            for d, w in zip(deltas, weights, strict=True):
                if not _is_lora_delta(d, int(w.shape[1])):
                    return result.fail("q/k/v addend is not a LoRA branch of its width", d)
        return result

    def rewrite(self, op, x, wq, wk, wv, attention, bq=None, bk=None, bv=None, **parts):
        node = attention.producer()
        graph = wq.graph
        dtype = wq.dtype
        packed_w = concat_parameter(graph, (wq, wk, wv), axis=1, dtype=dtype, suffix=".weight")
        packed = op.MatMul(x, packed_w)
        if self.bias:
            packed_b = concat_parameter(graph, (bq, bk, bv), axis=0, dtype=dtype, suffix=".bias")
            packed = op.Add(packed, packed_b)
        if self.lora:
            deltas = (parts["dq"], parts["dk"], parts["dv"])
            packed = op.Add(packed, op.Concat(*deltas, axis=-1))
        packed.type = x.type
        if x.shape is not None:  # [..., q + 2 * kv width], as the three projections had
            packed.shape = ir.Shape([*x.shape[:-1], int(packed_w.shape[1])])
        rest = list(node.inputs[PAST_KEY:])
        attributes = {name: attr for name, attr in node.attributes.items()}
        return op.op(
            GQA_OP,
            packed,
            None,
            None,
            *rest,
            _domain=MS_DOMAIN,
            _outputs=3,
            **attributes,
        )


def _is_lora_delta(delta: ir.Value, width: int) -> bool:
    """(x @ A) @ B with B a graph input of `width` columns (components/lora.py)."""
    node = delta.producer()
    if node is None or node.op_type != "MatMul" or node.domain != "":
        return False
    b = node.inputs[1]
    return b is not None and b.is_graph_input() and b.shape is not None and b.shape[-1] == width


def concat_parameter(
    graph: ir.Graph, values: Sequence[ir.Value], axis: int, dtype: ir.DataType, suffix: str
) -> ir.Value:
    """A new initializer concatenating `values` along `axis`, read only when saved (a
    `ConcatTensor`), named after the first with q_proj → qkv_proj; no value if they have none."""
    shape = [int(d) for d in values[0].shape]
    shape[axis] = sum(int(v.shape[axis]) for v in values)
    tensors = [v.const_value for v in values]
    make = None
    if all(t is not None for t in tensors):

        def make(name: str) -> ir.LazyTensor:
            return ConcatTensor(tensors, axis, dtype, name)

    return new_parameter(graph, _packed_name(values[0].name or "qkv", suffix), shape, dtype, make)


def rules() -> pattern.RewriteRuleSet:
    """PackQKV with and without projection biases and LoRA branches."""
    return pattern.RewriteRuleSet(
        [PackQKV.rule(bias=bias, lora=lora) for lora in (True, False) for bias in (True, False)]
    )
