"""UnpackQKV: a packed q/k/v projection feeding GQA → three projections (inverse of PackQKV).

Math preserved: with the packed weight W = [Wq | Wk | Wv] split at the column offsets
``num_heads * head_dim`` and ``(num_heads + kv_num_heads) * head_dim``,

    x @ W + b = concat(x @ Wq + bq, x @ Wk + bk, x @ Wv + bv, axis=-1)

and GroupQueryAttention given separate query, key and value computes what it computes from
the packed query. The three weights (and biases) are new initializers whose values are
``ir.LazyTensor`` slices of the packed one, read only when saved; without weights they have
no value either.

For EPs whose GQA kernel does not take packed QKV (``supports_fused_rope=False``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.optimize.declines import RecordingRuleClassBase
from mobius_genai.optimize.rules.gqa import GQA_OP, MS_DOMAIN, PAST_KEY
from mobius_genai.optimize.rules.pack_qkv import new_parameter


def lazy_slice(
    tensor: ir.TensorProtocol, axis: int, start: int, stop: int, name: str
) -> ir.LazyTensor:
    """A tensor equal to ``tensor[..., start:stop, ...]`` along `axis`, computed when read."""
    shape = list(tensor.shape.numpy())
    shape[axis] = stop - start
    dtype = tensor.dtype

    def load() -> ir.TensorProtocol:
        index = [slice(None)] * len(shape)
        index[axis] = slice(start, stop)
        array = np.ascontiguousarray(tensor.numpy()[tuple(index)])
        return ir.Tensor(array, dtype=dtype, name=name)

    return ir.LazyTensor(load, dtype=dtype, shape=ir.Shape(shape), name=name)


def _part_names(packed_name: str, suffix: str) -> list[str]:
    if "qkv_proj" in packed_name:
        return [packed_name.replace("qkv_proj", f"{p}_proj") for p in "qkv"]
    return [f"{packed_name}.{p}{suffix}" for p in "qkv"]


def _split_parameter(
    graph: ir.Graph, packed: ir.Value, axis: int, bounds: Sequence[int], suffix: str
) -> list[ir.Value]:
    parts = []
    shape = [int(d) for d in packed.shape]
    source = packed.const_value
    names = _part_names(packed.name or "qkv", suffix)
    for name, start, stop in zip(names, bounds[:-1], bounds[1:], strict=True):
        part_shape = list(shape)
        part_shape[axis] = stop - start
        make = None
        if source is not None:

            def make(final: str, start: int = start, stop: int = stop) -> ir.LazyTensor:
                return lazy_slice(source, axis, start, stop, final)

        parts.append(new_parameter(graph, name, part_shape, packed.dtype, make))
    return parts


class UnpackQKV(RecordingRuleClassBase):
    """GQA(MatMul(x, W) [+ b], <empty>, <empty>) → GQA(x @ Wq [+ bq], x @ Wk [+ bk], x @ Wv [+ bv])."""

    def __init__(self, bias: bool) -> None:
        super().__init__("UnpackQKV")
        self.bias = bias
        self._bounds: list[int] = []

    def pattern(self, op, x, w, b):
        packed = op.MatMul(x, w)
        if self.bias:
            packed = op.Add(packed, b)
        return op.GroupQueryAttention(
            packed,
            None,
            None,
            _domain=MS_DOMAIN,
            _allow_other_inputs=True,
            _allow_other_attributes=True,
            _outputs=["attention", "present_key", "present_value"],
        )

    def check(self, context, w, attention, b=None, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        node = attention.producer()
        if not w.is_initializer() or w.shape is None or len(w.shape) != 2:
            return result.fail("packed weight is not a 2-D initializer", w)
        width = w.shape[1]
        if not isinstance(width, int):
            return result.fail("packed weight has a symbolic width", w)
        num_heads = node.attributes.get_int("num_heads", 0)
        kv_num_heads = node.attributes.get_int("kv_num_heads", 0)
        heads = num_heads + 2 * kv_num_heads
        if num_heads <= 0 or kv_num_heads <= 0 or width % heads:
            return result.fail(
                f"packed width {width} is not (num_heads + 2 * kv_num_heads) * head_dim", node
            )
        head_dim = width // heads
        q_end = num_heads * head_dim
        k_end = q_end + kv_num_heads * head_dim
        self._bounds = [0, q_end, k_end, width]
        if self.bias:
            if not b.is_initializer() or b.shape is None or list(b.shape) != [width]:
                return result.fail("packed bias is not a 1-D initializer of the packed width", b)
            if (b.const_value is None) != (w.const_value is None):
                return result.fail("packed bias and weight disagree on having values", b)
        return result

    def rewrite(self, op, x, w, attention, b=None, **_):
        node = attention.producer()
        graph = w.graph
        weights = _split_parameter(graph, w, 1, self._bounds, ".weight")
        projections = [op.MatMul(x, weight) for weight in weights]
        if self.bias:
            biases = _split_parameter(graph, b, 0, self._bounds, ".bias")
            projections = [op.Add(p, bias) for p, bias in zip(projections, biases, strict=True)]
        attributes = {name: attr for name, attr in node.attributes.items()}
        return op.op(
            GQA_OP,
            *projections,
            *node.inputs[PAST_KEY:],
            _domain=MS_DOMAIN,
            _outputs=3,
            **attributes,
        )


def rules() -> pattern.RewriteRuleSet:
    """UnpackQKV with and without a packed bias."""
    return pattern.RewriteRuleSet([UnpackQKV.rule(bias=True), UnpackQKV.rule(bias=False)])
