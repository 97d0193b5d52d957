"""Stored block integers in onnxruntime's layouts, and pre-quantized [N, K] tables (a GGUF's
token embedding, read by a tied lm_head too) into MatMulNBits and GatherBlockQuantized.

Math preserved exactly: the table ``T[n, k] = (q[n, k] - zero[n, k / bs]) * scale[n, k / bs]``
is B of ``MatMulNBits`` for the lm_head (``A @ T^T``) and, viewed as [N, K*bits/8], the data
of ``GatherBlockQuantized(B, ids, scales[, zero_points])`` for the lookup: the layouts
`MatMulNBitsPass` writes from float weights, filled with the stored integers (one copy for both
ops). GatherBlockQuantized takes no float zero points and onnxruntime's cpu MatMulNBits no
8-bit float ones: those uses stay float (the table reads as its dequantized values). The
MatMulNBits are written at accuracy level 0; `apply_prequantized` sets one level for all.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor, StoredBlocks
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
        if tensor.zero_form == "float" and (tensor.bits == 8 or group.gathers):
            reason = "float zero points: no GatherBlockQuantized"
            if tensor.bits == 8 and group.matmuls:
                reason += ", no 8-bit MatMulNBits on cpu"
                group = dataclasses.replace(group, matmuls=[])
            dequantized.append(f"{group.source.name} ({reason})")
            group = dataclasses.replace(group, gathers=[])
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
        tensor = cast(PrequantizedTensor, group.source.values[0].const_value)
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
    """`MatMulNBitsPass` whose B, scales and zero points are a pre-quantized table's own."""

    def _initializers(
        self, writer: GraphWriter, group: WeightGroup, format_: WeightFormat, base: str
    ) -> list[ir.Value]:
        source = group.source
        tensor = cast(PrequantizedTensor, source.values[0].const_value)
        n, blocks = source.n, source.k // format_.block_size
        row_bytes = format_.block_size * format_.bits // 8
        data_shape = (n, blocks, row_bytes) if group.matmuls else (n, blocks * row_bytes)
        specs = [
            PartSpec(base, ir.DataType.UINT8, data_shape),
            PartSpec(writer.unique_name(f"{base}_scales"), source.dtype, (n, blocks)),
        ]
        zeros = writer.unique_name(f"{base}_zero_points")
        if tensor.zero_form == "uint8":
            specs.append(PartSpec(zeros, ir.DataType.UINT8, (n, (blocks * format_.bits + 7) // 8)))
        elif tensor.zero_form == "float":
            specs.append(PartSpec(zeros, source.dtype, (n, blocks)))

        def compute() -> list[ir.TensorProtocol]:
            arrays = nbits_arrays(
                [tensor.read_blocks()],
                format_.bits,
                format_.block_size,
                tensor.zero_form,
                source.dtype,
            )
            arrays[0] = arrays[0].reshape(data_shape)
            return [ir.Tensor(a, name=s.name) for a, s in zip(arrays, specs, strict=True)]

        return writer.initializers(specs, lazy_parts(self.cache, specs, compute))


def nbits_arrays(
    stored: list[StoredBlocks], bits: int, block_size: int, zero_form: str, dtype: ir.DataType
) -> list[np.ndarray]:
    """MatMulNBits' B [N, K/bs, bs*bits/8], scales and zero points (per `zero_form`) of the
    stored blocks of weights concatenated along N."""
    values = np.concatenate([s.values for s in stored], axis=0)
    n, k = values.shape
    values = values.reshape(n, k // block_size, block_size)
    arrays = [_pack(values, bits), np.concatenate([s.scales for s in stored], 0)]
    arrays[1] = arrays[1].astype(dtype.numpy())
    zeros = np.concatenate([s.zeros for s in stored], axis=0)
    if zero_form == "uint8":
        arrays.append(_pack(zeros.astype(np.uint8), bits))
    elif zero_form == "float":
        arrays.append(zeros.astype(dtype.numpy()))
    return arrays


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values along the last axis, packed 8/bits per byte, first in the low bits."""
    if bits == 8:
        return np.ascontiguousarray(values, np.uint8)
    if values.shape[-1] % 2:
        pad = np.zeros((*values.shape[:-1], 1), np.uint8)
        values = np.concatenate([values, pad], axis=-1)
    return np.ascontiguousarray(values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
