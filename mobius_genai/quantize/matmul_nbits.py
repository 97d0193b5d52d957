"""The onnxruntime INT4 graph: com.microsoft::MatMulNBits and GatherBlockQuantized.

Math preserved, up to the 4-bit rounding of the weights: ``A @ W`` becomes
``MatMulNBits(A, B, scales[, zero_points])`` with ``W[k, n] = (B[n, k] - zp[n, k/bs]) *
scales[n, k/bs]`` (bits=4, zero point 8 when symmetric), and ``Gather(T, ids, axis=0)`` on an
[N, K] table becomes ``GatherBlockQuantized(B', ids, scales[, zero_points])`` with B' = B
reshaped to [N, K/2] (uint8 data, bits=4, quantize_axis=1), the same values. A tied embedding
table therefore has one quantized copy: its lm_head MatMulNBits reads B, its lookup reads
Reshape(B). Weights the recipe keeps in 8 bits use the same ops with bits=8 (one byte per value,
zero points one byte per block, implicit zero point 128).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.quantize.graph_writer import GraphWriter
from mobius_genai.quantize.layout import plan_search, quantize_matmul_nbits_columns
from mobius_genai.quantize.recipes import WeightFormat
from mobius_genai.quantize.search_pool import Lookahead
from mobius_genai.quantize.streaming import OneWeightCache, PartSpec, lazy_parts
from mobius_genai.quantize.weight_uses import WeightGroup

__all__ = ["MatMulNBitsPass"]


class MatMulNBitsPass(ir.passes.InPlacePass):
    """Quantize `groups` (found by `find_weights`) to MatMulNBits / GatherBlockQuantized.

    `formats` gives each group's bits (4 or 8) and block size; `search` rounds with the
    per-block search instead of onnxruntime's round-to-nearest kernel. `gather` says whether
    embedding lookups become GatherBlockQuantized (the EP has that kernel for the model dtype);
    otherwise they stay float and a tied lm_head gets its own quantized copy. Parts are lazy
    tensors computed at save time through `cache`. `importance` (per group, [K] or None)
    weights the search of the 4-bit weights (`rounding.search_blocks`).
    """

    def __init__(
        self,
        groups: list[WeightGroup],
        *,
        formats: list[WeightFormat],
        symmetric: bool,
        search: bool,
        accuracy_level: int,
        gather: bool,
        cache: OneWeightCache,
        importance: list[np.ndarray | None] | None = None,
    ) -> None:
        super().__init__()
        self.groups = groups
        self.formats = formats
        self.symmetric = symmetric
        self.search = search
        self.accuracy_level = accuracy_level
        self.gather = gather
        self.cache = cache
        #: The search's requests, planned as the parts are made (the order they are saved in).
        self.lookahead = Lookahead()
        #: id(group) -> its importance (a subclass may override `_initializers`).
        self.importance = dict(zip(map(id, groups), importance, strict=True)) if importance else {}
        #: Per group (same order): the op types it now feeds, empty when left in float.
        self.results: list[tuple[str, ...]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        writer = GraphWriter(model.graph)
        for group, format_ in zip(self.groups, self.formats, strict=True):
            self.results.append(self.rewrite(writer, group, format_))
        writer.remove_unused()
        modified = any(self.results)
        if modified:
            model.opset_imports.setdefault(MS_DOMAIN, 1)
        return ir.passes.PassResult(model, modified=modified)

    def rewrite(
        self, writer: GraphWriter, group: WeightGroup, format_: WeightFormat
    ) -> tuple[str, ...]:
        """Quantize `group`'s weight in `format_` and rewrite its uses: the op types they now
        are (empty when it stays float). Subclasses (stored tables) change how, per group."""
        gathers = group.gathers if self.gather else []
        if not group.matmuls and not gathers:
            return ()
        base = writer.unique_name(f"{group.source.name}_Q{format_.bits}")
        inputs = self._initializers(writer, group, format_, base)
        for use in group.matmuls:
            writer.replace(use.node, [self._matmul(use.node, group, format_, inputs)])
        for use in gathers:
            writer.replace(use.node, self._gather(writer, use.node, group, format_, base, inputs))
        return ("MatMulNBits",) * len(group.matmuls) + ("GatherBlockQuantized",) * len(gathers)

    def _initializers(
        self, writer: GraphWriter, group: WeightGroup, format_: WeightFormat, base: str
    ) -> list[ir.Value]:
        """B, scales[, zero_points] of `group`, computed from the weight at save time."""
        source = group.source
        k, n = source.k, source.n
        bits, block_size = format_.bits, format_.block_size
        blocks = k // block_size
        # B is [N, blocks, bs*bits/8] for MatMulNBits; a lookup-only table stores [N, K*bits/8].
        row_bytes = block_size * bits // 8
        data_shape = (n, blocks, row_bytes) if group.matmuls else (n, blocks * row_bytes)
        specs = [
            PartSpec(base, ir.DataType.UINT8, data_shape),
            PartSpec(writer.unique_name(f"{base}_scales"), source.dtype, (n, blocks)),
        ]
        if not self.symmetric:
            zero_points_name = writer.unique_name(f"{base}_zero_points")
            zero_shape = (n, (blocks * bits + 7) // 8)
            specs.append(PartSpec(zero_points_name, ir.DataType.UINT8, zero_shape))

        search = self.search and bits == 4
        importance = self.importance.get(id(group)) if search else None
        dtype = np.dtype(source.dtype.numpy())
        request = source.column_request() if search and source.has_data else None
        ahead = (self.lookahead, object())  # this weight's key in the search's plan
        if request is not None:  # planned in the order the saver will ask for the weights
            plan_search(
                ahead, request, (k, n), dtype, block_size, self.symmetric, importance=importance
            )

        def compute() -> list[ir.TensorProtocol]:
            weight = quantize_matmul_nbits_columns(
                source.column_reader(),
                k,
                n,
                dtype,
                block_size,
                self.symmetric,
                bits=bits,
                search=search,
                importance=importance,
                request=request,
                ahead=ahead,
            )
            arrays = [weight.packed.reshape(data_shape), weight.scales]
            if weight.zero_points is not None:
                arrays.append(weight.zero_points)
            return [
                ir.Tensor(array, name=spec.name) for array, spec in zip(arrays, specs, strict=True)
            ]

        tensors = lazy_parts(self.cache, specs, compute) if source.has_data else None
        return writer.initializers(specs, tensors)

    def _matmul(
        self, node: ir.Node, group: WeightGroup, format_: WeightFormat, inputs: list[ir.Value]
    ) -> ir.Node:
        """MatMulNBits in place of the MatMul `node`."""
        attributes = {
            "K": group.source.k,
            "N": group.source.n,
            "bits": format_.bits,
            "block_size": format_.block_size,
        }
        # 0 is the default: leave it out, as onnxruntime's own quantizer does.
        if self.accuracy_level:
            attributes["accuracy_level"] = self.accuracy_level
        return ir.node(
            "MatMulNBits",
            [node.inputs[0], *inputs],
            attributes,
            domain=MS_DOMAIN,
            name=f"{node.name}_Q{format_.bits}",
        )

    def _gather(
        self,
        writer: GraphWriter,
        node: ir.Node,
        group: WeightGroup,
        format_: WeightFormat,
        base: str,
        inputs: list[ir.Value],
    ) -> list[ir.Node]:
        """GatherBlockQuantized in place of the Gather `node` (a Reshape views a shared B as
        [N, K*bits/8])."""
        data, *rest = inputs
        new_nodes = []
        if group.matmuls:  # share B: view it as [N, K*bits/8]
            k, n = group.source.k, group.source.n
            row = k * format_.bits // 8
            shape = writer.constant(f"{base}_gather_shape", np.array([n, row], np.int64))
            reshape = ir.node("Reshape", [data, shape], name=f"{node.name}_Q{format_.bits}_reshape")
            data = reshape.outputs[0]
            data.name = f"{base}_gather_view"
            new_nodes.append(reshape)
        attributes = {
            "bits": format_.bits,
            "block_size": format_.block_size,
            "gather_axis": 0,
            "quantize_axis": 1,
        }
        new_nodes.append(
            ir.node(
                "GatherBlockQuantized",
                [data, node.inputs[1], *rest],
                attributes,
                domain=MS_DOMAIN,
                name=f"{node.name}_Q{format_.bits}",
            )
        )
        return new_nodes
