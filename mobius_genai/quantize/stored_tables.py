"""Stored block integers in onnxruntime's layouts, and pre-quantized [N, K] tables (a GGUF's
token embedding, read by a tied lm_head too) into MatMulNBits and GatherBlockQuantized.

Math preserved exactly: the table ``T[n, k] = (q[n, k] - zero[n, k / bs]) * scale[n, k / bs]``
is B of ``MatMulNBits`` for the lm_head (``A @ T^T``) and, viewed as [N, K*bits/8], the data
of ``GatherBlockQuantized(B, ids, scales[, zero_points])`` for the lookup: the layouts
`MatMulNBitsPass` writes from float weights, filled with the stored integers (one copy for both
ops). Float zero points z (Q4_1, Q4_K, Q5_1, Q5_K tables: GatherBlockQuantized takes none,
onnxruntime's cpu MatMulNBits no 8-bit ones and is slow on 4-bit ones) become integer zero
points round(z) plus block mins, for both uses (quantize/block_mins.py): no float table, and a
tied lm_head on the fast integer kernels. Where the EP has no GatherBlockQuantized for the
model dtype the lookup stays float (the table reads as its dequantized values). The
MatMulNBits are written at accuracy level 0; `apply_prequantized` sets one level for all.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor, StoredBlocks
from mobius_genai.quantize.block_mins import integer_zeros_and_mins, plus_block_mins, plus_row_mins
from mobius_genai.quantize.graph_writer import GraphWriter
from mobius_genai.quantize.matmul_nbits import MatMulNBitsPass
from mobius_genai.quantize.recipes import WeightFormat
from mobius_genai.quantize.streaming import OneWeightCache, PartSpec, lazy_parts
from mobius_genai.quantize.weight_uses import WeightGroup, find_weights

__all__ = ["TablesReport", "apply_stored_tables", "nbits_arrays", "table_uses"]


@dataclasses.dataclass(frozen=True)
class TablesReport:
    """What `apply_stored_tables` wrote."""

    matmuls: list[tuple[int, int, str]]
    """(bits, block size, zero-point form) of each MatMulNBits (a tied lm_head)."""
    lookups: int
    """GatherBlockQuantized nodes (embedding lookups)."""
    dequantized: list[str]
    """Tables some of whose uses stay float, and why."""
    kept: list[PrequantizedTensor]
    """Tables read by at least one MatMulNBits or GatherBlockQuantized."""
    left_float: list[PrequantizedTensor]
    """Tables all of whose uses stay float."""


def apply_stored_tables(model: ir.Model, gather: bool, cache: OneWeightCache) -> TablesReport:
    """Rewrite the uses of each pre-quantized table (`PrequantizedTensor.table`) in place.

    `gather`: the EP has GatherBlockQuantized for the model dtype (else lookups stay float).
    """
    groups, formats, dequantized = [], [], []
    for group, tensor in table_uses(model.graph):
        if group.gathers and not gather:
            reason = f"no GatherBlockQuantized for {group.source.dtype} on this EP: lookup in float"
            dequantized.append(f"{group.source.name} ({reason})")
        groups.append(group)
        formats.append(WeightFormat(tensor.bits, tensor.block_size))
    quantizer = StoredTablesPass(
        groups,
        formats=formats,
        symmetric=True,  # unused: the zero points are the stored ones
        search=False,
        accuracy_level=0,  # apply_prequantized sets the bundle's level
        gather=gather,
        cache=cache,
    )
    quantizer(model)
    matmuls, lookups, kept, left_float = [], 0, [], []
    for group, format_, ops in zip(groups, formats, quantizer.results, strict=True):
        tensor = _table(group)
        matmuls += [(format_.bits, format_.block_size, tensor.zero_form)] * ops.count("MatMulNBits")
        lookups += ops.count("GatherBlockQuantized")
        (kept if ops else left_float).append(tensor)
    return TablesReport(matmuls, lookups, dequantized, kept, left_float)


def table_uses(graph: ir.Graph) -> list[tuple[WeightGroup, PrequantizedTensor]]:
    """Each pre-quantized table of `graph` with its uses."""
    found = []
    for group in find_weights(graph)[0]:
        values = group.source.values
        tensor = values[0].const_value if len(values) == 1 else None
        if isinstance(tensor, PrequantizedTensor) and tensor.table and group.source.stored_nk:
            found.append((group, tensor))
    return found


class StoredTablesPass(MatMulNBitsPass):
    """`MatMulNBitsPass` whose B, scales and zero points are a pre-quantized table's own (float
    zero points: integer ones, and block mins added after each use)."""

    def rewrite(
        self, writer: GraphWriter, group: WeightGroup, format_: WeightFormat
    ) -> tuple[str, ...]:
        if _table(group).zero_form != "float":
            return super().rewrite(writer, group, format_)
        gathers = group.gathers if self.gather else []
        if not group.matmuls and not gathers:
            return ()
        base = writer.unique_name(f"{group.source.name}_Q{format_.bits}")
        *inputs, mins = self._initializers(writer, group, format_, base)
        for use in group.matmuls:
            nbits = self._matmul(use.node, group, format_, inputs)
            a = use.node.inputs[0]
            assert a is not None
            writer.replace(use.node, [nbits, *plus_block_mins(writer, a, nbits, mins, {})])
        for use in gathers:
            ids = use.node.inputs[1]
            assert ids is not None
            nodes = self._gather(writer, use.node, group, format_, base, inputs)
            shared = bool(group.matmuls)
            nodes += plus_row_mins(writer, nodes[-1], ids, mins, format_.block_size, shared)
            writer.replace(use.node, nodes)
        return ("MatMulNBits",) * len(group.matmuls) + ("GatherBlockQuantized",) * len(gathers)

    def _initializers(
        self, writer: GraphWriter, group: WeightGroup, format_: WeightFormat, base: str
    ) -> list[ir.Value]:
        source, tensor = group.source, _table(group)
        n, blocks = source.n, source.k // format_.block_size
        row_bytes = format_.block_size * format_.bits // 8
        data_shape = (n, blocks, row_bytes) if group.matmuls else (n, blocks * row_bytes)
        specs = [
            PartSpec(base, ir.DataType.UINT8, data_shape),
            PartSpec(writer.unique_name(f"{base}_scales"), source.dtype, (n, blocks)),
        ]
        zeros = writer.unique_name(f"{base}_zero_points")
        if tensor.zero_form != "implicit":  # float: round(z), the rest in the block mins
            specs.append(PartSpec(zeros, ir.DataType.UINT8, (n, (blocks * format_.bits + 7) // 8)))
        if tensor.zero_form == "float":  # [K/bs, N] where a tied lm_head reads them
            mins_shape = (blocks, n) if group.matmuls else (n, blocks)
            specs.append(PartSpec(writer.unique_name(f"{base}_mins"), source.dtype, mins_shape))

        def compute() -> list[ir.TensorProtocol]:
            bits, size = format_.bits, format_.block_size
            arrays = nbits_arrays(
                [tensor.read_blocks()], bits, size, tensor.zero_form, source.dtype
            )
            arrays[0] = arrays[0].reshape(data_shape)
            if tensor.zero_form == "float" and not group.matmuls:  # the lookup's [N, K/bs]
                arrays[3] = np.ascontiguousarray(arrays[3].T)
            return [ir.Tensor(a, name=s.name) for a, s in zip(arrays, specs, strict=True)]

        return writer.initializers(specs, lazy_parts(self.cache, specs, compute))


def _table(group: WeightGroup) -> PrequantizedTensor:
    return cast(PrequantizedTensor, group.source.values[0].const_value)


def nbits_arrays(
    stored: list[StoredBlocks], bits: int, block_size: int, zero_form: str, dtype: ir.DataType
) -> list[np.ndarray]:
    """MatMulNBits' B [N, K/bs, bs*bits/8], scales and zero points (per `zero_form`) of the
    stored blocks of weights concatenated along N. Float zero points become their nearest
    codes, and the block mins [K/bs, N] that `plus_block_mins` reads follow them
    (quantize/block_mins.py)."""
    mins = None
    if zero_form == "float":
        joined, mins = integer_zeros_and_mins(stored, bits)
        stored, zero_form = [joined], "uint8"
    values = np.concatenate([s.values for s in stored], axis=0)
    n, k = values.shape
    values = values.reshape(n, k // block_size, block_size)
    arrays = [_pack(values, bits), np.concatenate([s.scales for s in stored], 0)]
    arrays[1] = arrays[1].astype(dtype.numpy())
    zeros = np.concatenate([s.zeros for s in stored], axis=0)
    if zero_form == "uint8":
        arrays.append(_pack(zeros.astype(np.uint8), bits))
    if mins is not None:
        arrays.append(np.ascontiguousarray(mins.T).astype(dtype.numpy()))
    return arrays


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values along the last axis, packed 8/bits per byte, first in the low bits."""
    if bits == 8:
        return np.ascontiguousarray(values, np.uint8)
    if values.shape[-1] % 2:
        pad = np.zeros((*values.shape[:-1], 1), np.uint8)
        values = np.concatenate([values, pad], axis=-1)
    return np.ascontiguousarray(values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
