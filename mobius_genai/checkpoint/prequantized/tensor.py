"""`PrequantizedTensor`: a [K, N] graph weight held as a format's block integers.

A block of `block_size` consecutive input features (after `perm`, see below) of one output
feature shares a scale and a zero point: ``w = (q - zero) * scale``. That is exactly
MatMulNBits' formula, so the integers and scales pass through unchanged. The zero points come
in three forms: `implicit` (all 2^(bits-1), MatMulNBits' default), `uint8` (integers 0 ..
2^bits - 1) and `float` (any value, for formats with a float offset: w = d*q + m is
(q - (-m/d)) * d).

`perm`: for GPTQ act-order the groups are not runs of consecutive input features. The stored
integers are then kept in the order `perm` (input feature `perm[j]` at position j), where each
group is a run, and the graph gathers its activations in the same order: exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import onnx_ir as ir

__all__ = ["ZERO_FORMS", "PrequantizedTensor", "StoredBlocks", "matrices"]

#: How a weight's zero points are stored, from the most to the least compact.
ZERO_FORMS = ("implicit", "uint8", "float")


@dataclasses.dataclass(frozen=True)
class StoredBlocks:
    """The integers, scales and zero points of one [K, N] weight, per output feature."""

    values: np.ndarray
    """[N, K] uint8, 0 .. 2^bits - 1, input features in the weight's `perm` order."""
    scales: np.ndarray
    """[N, K / block_size] float."""
    zeros: np.ndarray
    """[N, K / block_size]: integers (implicit and uint8 forms) or float."""

    def dequantize(self, block_size: int) -> np.ndarray:
        """[N, K] float32 ``(q - zero) * scale`` in the stored (perm) order."""
        n, k = self.values.shape
        q = self.values.reshape(n, k // block_size, block_size).astype(np.float32)
        zeros = self.zeros.astype(np.float32)[:, :, None]
        scales = self.scales.astype(np.float32)[:, :, None]
        return ((q - zeros) * scales).reshape(n, k)


class PrequantizedTensor(ir.LazyTensor):
    """A Linear weight [K, N] of the graph whose value is a format's stored block integers,
    or with `table` an [N, K] table (a token embedding, also read by a tied lm_head).

    Read as a tensor (``numpy()``) it is the float weight the format's formula gives, in the
    graph's dtype, so any pass that does not know it still computes the right thing; the
    `quantize.stored_weights` pass writes `read_blocks()` into MatMulNBits as they are.
    `scheme` names its stored kind for reports (e.g. "GPTQ 4-bit", "Q4_K" for a GGUF);
    `sources` are the checkpoint tensors it reads.
    """

    def __init__(
        self,
        read_blocks: Callable[[], StoredBlocks],
        *,
        k: int,
        n: int,
        bits: int,
        block_size: int,
        zero_form: str,
        scheme: str,
        dtype: ir.DataType,
        name: str,
        perm: np.ndarray | None = None,
        sources: tuple[str, ...] = (),
        table: bool = False,
    ) -> None:
        if zero_form not in ZERO_FORMS:
            raise ValueError(f"zero form {zero_form!r}; accepted: {', '.join(ZERO_FORMS)}")
        shape = ir.Shape((n, k) if table else (k, n))
        super().__init__(self._dequantized, dtype=dtype, shape=shape, name=name)
        self.read_blocks = read_blocks
        self.bits = bits
        self.block_size = block_size
        self.zero_form = zero_form
        self.scheme = scheme
        self.perm = perm
        self.sources = sources
        self.table = table

    def _dequantized(self) -> ir.TensorProtocol:
        rows = self.read_blocks().dequantize(self.block_size)  # [N, K] in perm order
        if self.perm is not None:
            ordered = np.empty_like(rows)
            ordered[:, self.perm] = rows
            rows = ordered
        rows = rows if self.table else rows.T
        return ir.Tensor(np.ascontiguousarray(rows.astype(self.dtype.numpy())), name=self.name)


def matrices(parameters: Mapping[str, ir.Value]) -> Iterator[tuple[str, ir.Value]]:
    """The [K, N] parameters still without a value: the weights a stored format may hold."""
    for name, value in parameters.items():
        if value.const_value is None and value.shape is not None and value.shape.rank() == 2:
            yield name, value
