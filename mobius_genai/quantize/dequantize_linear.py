"""The standard-ONNX INT4 graph: blocked DequantizeLinear (opset 21+) feeding MatMul.

Math preserved, up to the 4-bit rounding of the weights: ``A @ W`` becomes
``A @ DequantizeLinear(Q, scales[, zero_points], axis=0, block_size=bs)`` with Q [K, N] int4
(symmetric) or uint4 (asymmetric), i.e. ``W[k, n] = (Q[k, n] - zp[k/bs, n]) * scales[k/bs, n]``.
No custom-domain op is emitted. Embedding lookups stay float (a standard Gather of int4 data
has no onnxruntime kernel), so a tied lm_head gets its own int4 copy of the table.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.quantize.graph_writer import GraphWriter
from mobius_genai.quantize.layout import quantize_blocked_int4
from mobius_genai.quantize.streaming import OneWeightCache, PartSpec, lazy_parts
from mobius_genai.quantize.weight_uses import WeightGroup

__all__ = ["MIN_OPSET", "DequantizeLinearPass"]

#: DequantizeLinear gained blocked quantization and int4/uint4 in opset 21.
MIN_OPSET = 21


class DequantizeLinearPass(ir.passes.InPlacePass):
    """Quantize the MatMul weights of `groups` to DequantizeLinear + MatMul (all 4-bit; `search`
    rounds with the per-block search instead of onnxruntime's round-to-nearest kernel, weighted
    by `importance`, per group [K] or None, as in `MatMulNBitsPass`)."""

    def __init__(
        self,
        groups: list[WeightGroup],
        *,
        block_size: int,
        symmetric: bool,
        search: bool,
        cache: OneWeightCache,
        importance: list[np.ndarray | None] | None = None,
    ) -> None:
        super().__init__()
        self.groups = groups
        self.block_size = block_size
        self.symmetric = symmetric
        self.search = search
        self.cache = cache
        self.importance = dict(zip(map(id, groups), importance, strict=True)) if importance else {}
        #: Per group (same order): the op types it now feeds, empty when left in float.
        self.results: list[tuple[str, ...]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model.opset_imports.get("", 0)
        if self.groups and any(group.matmuls for group in self.groups) and opset < MIN_OPSET:
            raise ValueError(
                f"INT4 DequantizeLinear needs ONNX opset >= {MIN_OPSET}; the graph imports {opset}"
            )
        writer = GraphWriter(model.graph)
        for group in self.groups:
            self.results.append(self._rewrite(writer, group))
        writer.remove_unused()
        return ir.passes.PassResult(model, modified=any(self.results))

    def _rewrite(self, writer: GraphWriter, group: WeightGroup) -> tuple[str, ...]:
        if not group.matmuls:
            return ()
        source = group.source
        k, n = source.k, source.n
        blocks = k // self.block_size
        qtype = ir.DataType.INT4 if self.symmetric else ir.DataType.UINT4
        base = writer.unique_name(f"{source.name}_Q4")
        specs = [
            PartSpec(base, qtype, (k, n)),
            PartSpec(writer.unique_name(f"{base}_scales"), source.dtype, (blocks, n)),
        ]
        if not self.symmetric:
            specs.append(
                PartSpec(writer.unique_name(f"{base}_zero_points"), ir.DataType.UINT4, (blocks, n))
            )

        importance = self.importance.get(id(group)) if self.search else None

        def compute() -> list[ir.TensorProtocol]:
            weight = quantize_blocked_int4(
                source.read(),
                self.block_size,
                self.symmetric,
                search=self.search,
                importance=importance,
            )
            parts: list[ir.TensorProtocol] = [
                ir.PackedTensor(weight.data, qtype, shape=(k, n), name=specs[0].name),
                ir.Tensor(weight.scales, name=specs[1].name),
            ]
            if weight.zero_points is not None:
                parts.append(
                    ir.PackedTensor(
                        weight.zero_points, ir.DataType.UINT4, shape=(blocks, n), name=specs[2].name
                    )
                )
            return parts

        tensors = lazy_parts(self.cache, specs, compute) if source.has_data else None
        inputs = writer.initializers(specs, tensors)
        for use in group.matmuls:
            node = use.node
            dequantize = ir.node(
                "DequantizeLinear",
                inputs,
                {"axis": 0, "block_size": self.block_size},
                name=f"{node.name}_DQ4",
            )
            dequantize.outputs[0].name = writer.unique_name(f"{base}_dequantized")
            dequantize.outputs[0].dtype = source.dtype
            dequantize.outputs[0].shape = ir.Shape((k, n))
            matmul = ir.node(
                "MatMul", [node.inputs[0], dequantize.outputs[0]], name=f"{node.name}_Q4"
            )
            writer.replace(node, [dequantize, matmul])
        return ("DequantizeLinear",) * len(group.matmuls)
