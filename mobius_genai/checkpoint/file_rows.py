"""Rows of a checkpoint matrix read from its safetensors file by a process that knows only the
file's path and the tensor's offset, dtype and shape (`StoredRows`).

The int4 search's worker processes (quantize/search_pool.py) read their own chunks this way:
the calling process sends a few numbers instead of reading, widening and pickling each chunk,
which was the larger part of its serial work. This module imports numpy only (a worker loads
nothing else from here); the file's header was parsed and checked by the caller
(`_safetensors.read_header`), and a worker reads bytes, never code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

__all__ = ["READABLE", "NotFinite", "StoredRows", "read_columns", "widen_bf16"]

#: The stored dtypes read here (safetensors names), as little-endian numpy dtypes; bfloat16 as
#: its bits.
_STORED = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}
#: The stored dtypes `StoredRows` reads.
READABLE = frozenset(_STORED)


class NotFinite(ValueError):
    """A read found NaN or Inf: the caller reads the same rows again to name the tensor."""


@dataclasses.dataclass(frozen=True)
class StoredRows:
    """Rows [row_start, row_stop) and columns [column_start, column_stop) of the 2-D tensor
    of `shape` stored as `dtype` ("BF16", "F16" or "F32") from byte `offset` of `file`."""

    file: str
    offset: int
    dtype: str
    shape: tuple[int, int]
    row_start: int
    row_stop: int
    column_start: int
    column_stop: int

    def read_transposed(self, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
        """The rows as [columns, rows] in `dtype` (float32 or float16), written into `out`
        when given; bfloat16 widened to float32 exactly (its bits moved to the high half).
        Raises NotFinite for a NaN or Inf, before or after the conversion."""
        stored = self._read().T
        if out is None:
            out = np.empty(stored.shape, dtype)
        if self.dtype == "BF16" and out.dtype == np.float32:
            widen_bf16(stored, out.view(np.uint32))
            finite = int(np.bitwise_and(stored, 0x7FFF).max(initial=0)) < 0x7F80
        else:
            np.copyto(out, stored, casting="unsafe")
            finite = bool(np.isfinite(out).all())
        if not finite:
            raise NotFinite(f"{self.file}: NaN or Inf in rows {self.row_start}..{self.row_stop}")
        return out

    def _read(self) -> np.ndarray:
        """The stored rows (every column), then the columns asked for, as stored."""
        stored = _STORED[self.dtype]
        columns = self.shape[1]
        rows = self.row_stop - self.row_start
        size = rows * columns * stored.itemsize
        buffer = bytearray(size)
        start = self.offset + self.row_start * columns * stored.itemsize
        with open(self.file, "rb", buffering=0) as stream:
            stream.seek(start)
            view, done = memoryview(buffer), 0
            while done < size:
                read = stream.readinto(view[done:])
                if not read:
                    raise OSError(f"{self.file}: ended before byte {start + size}")
                done += read
        array = np.frombuffer(buffer, stored).reshape(rows, columns)
        return array[:, self.column_start : self.column_stop]


def widen_bf16(bits: np.ndarray, out: np.ndarray) -> None:
    """out (uint32) = bf16 `bits` (uint16) as float32 bit patterns: exact, like the cast."""
    np.copyto(out, bits)
    out <<= 16


def read_columns(parts: Sequence[StoredRows], dtype: np.dtype) -> np.ndarray:
    """The [K, n] columns whose parts along n are `parts` (each [K, its rows]), contiguous in
    `dtype`."""
    widths = [part.row_stop - part.row_start for part in parts]
    k = parts[0].column_stop - parts[0].column_start
    out = np.empty((k, sum(widths)), dtype)
    first = 0
    for part, width in zip(parts, widths, strict=True):
        part.read_transposed(dtype, out[:, first : first + width])
        first += width
    return out
