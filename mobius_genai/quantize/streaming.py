"""Quantized initializers computed when they are saved, one weight at a time.

A weight's float values are lazy (`ir.LazyTensor` reading safetensors at save time), and so are
its quantized tensors: each is an `ir.LazyTensor` whose function asks a shared `OneWeightCache`
for its part. The first part asked for reads the float weight and quantizes it (one kernel run
gives packed data, scales and zero points together); the cache keeps those parts of that one
weight until each has been read, or until another weight is asked for. The saver writes a
weight's parts one after the other, so every weight is read and quantized once and at most one
weight's float values and quantized parts are alive at a time. Small parts still unread when the
cache moves on (ir.save writes tensors of up to 256 bytes into the model proto, after the
external data) are set aside, so tiny weights are not quantized twice either; a large part asked
for out of order is recomputed (the same bytes again), never kept around.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.file_rows import StoredRows, read_columns
from mobius_genai.checkpoint.weights import CheckpointTensor, ConcatTensor
from mobius_genai.quantize.layout import KERNEL_DTYPES, ColumnReader, ColumnRequest

__all__ = ["OneWeightCache", "PartSpec", "WeightSource", "lazy_parts"]


@dataclasses.dataclass(frozen=True)
class WeightSource:
    """A float weight seen as [K, N] (in, out), read from graph initializers only when asked.

    `values` are 2-D initializers concatenated along N (one, or several for a packed
    projection). With `stored_nk`, each initializer holds [N, K] (an embedding table) and is
    read through a transposed view.
    """

    values: tuple[ir.Value, ...]
    stored_nk: bool = False

    @property
    def name(self) -> str:
        return self.values[0].name or "weight"

    @property
    def k(self) -> int:
        dims = self.values[0].shape
        return int(dims[1] if self.stored_nk else dims[0])

    @property
    def n(self) -> int:
        axis = 0 if self.stored_nk else 1
        return sum(int(value.shape[axis]) for value in self.values)

    @property
    def dtype(self) -> ir.DataType:
        return self.values[0].dtype

    @property
    def has_data(self) -> bool:
        """False when the graph was built without weights (`load_weights=False`)."""
        return all(value.const_value is not None for value in self.values)

    def read(self) -> np.ndarray:
        """The [K, N] values (a transposed view for [N, K] storage; no copy for one part)."""
        arrays = [value.const_value.numpy() for value in self.values]  # type: ignore[union-attr]
        if self.stored_nk:
            arrays = [array.T for array in arrays]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=1)

    def column_reader(self) -> ColumnReader:
        """Columns of the [K, N] values, read as `quantize_matmul_nbits_columns` asks for them.

        Checkpoint matrices that the checkpoint stores [N, K] (a Linear weight, an embedding
        table), alone or concatenated along N (packed q/k/v), are read a block of their stored
        rows at a time, converted straight into the [K, columns] layout the kernel takes;
        anything else is read whole once, on first use.
        """
        tensors = _parts_along_n(self)
        if all(_n_rows_stored(tensor, self.stored_nk, self.dtype) for tensor in tensors):
            return functools.partial(_read_stored_columns, tensors)  # type: ignore[arg-type]
        whole: list[np.ndarray] = []

        def read(start: int, stop: int, dtype: np.dtype) -> np.ndarray:
            if not whole:
                whole.append(self.read())
            return np.ascontiguousarray(whole[0][:, start:stop], dtype=dtype)

        return read

    def column_request(self) -> ColumnRequest | None:
        """Where columns of the [K, N] values lie in the checkpoint's files, for a search
        worker to read them itself (`file_rows.read_columns`: the same values as
        `column_reader`'s); None unless every part is a stored matrix of a safetensors file
        whose rows are the output features."""
        tensors = _parts_along_n(self)
        if not all(
            _n_rows_stored(tensor, self.stored_nk, self.dtype)
            and tensor.stored_rows_in_file(0, 0) is not None  # type: ignore[attr-defined]
            for tensor in tensors
        ):
            return None
        return functools.partial(_stored_columns_request, tensors)  # type: ignore[arg-type]


def _parts_along_n(source: WeightSource) -> list[object]:
    """The tensors whose concatenation along N is the weight (concatenations opened up)."""
    n_axis = 0 if source.stored_nk else 1
    parts: list[object] = []
    for value in source.values:
        tensor = value.const_value
        if isinstance(tensor, ConcatTensor) and tensor.axis == n_axis:
            parts.extend(tensor.parts)
        else:
            parts.append(tensor)
    return parts


def _n_rows_stored(tensor: object, stored_nk: bool, dtype: ir.DataType) -> bool:
    """`tensor` is a checkpoint matrix whose stored rows are the weight's N output features.

    The graph holds [K, N] (or [N, K] when `stored_nk`); `transposed` flips that. Exact only
    when the kernel computes in the graph's dtype (bfloat16 goes through it first).
    """
    return (
        isinstance(tensor, CheckpointTensor)
        and tensor.transposed != stored_nk
        and np.dtype(dtype.numpy()) in KERNEL_DTYPES
    )


def _read_stored_columns(
    tensors: Sequence[CheckpointTensor], start: int, stop: int, dtype: np.dtype
) -> np.ndarray:
    """Columns [start, stop) of the [K, N] weight whose parts along N are `tensors`."""
    columns = []
    first = 0
    for tensor in tensors:
        count = tensor.stored_shape[0]
        lo, hi = max(start, first), min(stop, first + count)
        if lo < hi:
            part = tensor.stored_rows(lo - first, hi - first, transpose=True)
            columns.append(part.astype(dtype, copy=False))
        first += count
    return columns[0] if len(columns) == 1 else np.ascontiguousarray(np.concatenate(columns, 1))


def _stored_columns_request(
    tensors: Sequence[CheckpointTensor], start: int, stop: int, dtype: np.dtype
) -> Callable[[], np.ndarray]:
    """A picklable reader of columns [start, stop) of the weight whose parts are `tensors`."""
    parts: list[StoredRows] = []
    first = 0
    for tensor in tensors:
        count = tensor.stored_shape[0]
        lo, hi = max(start, first), min(stop, first + count)
        if lo < hi:
            parts.append(tensor.stored_rows_in_file(lo - first, hi - first))  # type: ignore[arg-type]
        first += count
    return functools.partial(read_columns, tuple(parts), np.dtype(dtype))


class OneWeightCache:
    """Holds the quantized parts of the one weight computed most recently.

    Unread parts of at most `keep_bytes` are set aside when another weight is computed.
    `computations` counts kernel runs (tests use it to check that each weight is quantized once
    per save).
    """

    def __init__(self, keep_bytes: int = 64 * 1024) -> None:
        self._lock = threading.Lock()
        self._key: object = None
        self._parts: Sequence[ir.TensorProtocol] | None = None
        self._unread: set[int] = set()
        self._kept: dict[tuple[int, int], ir.TensorProtocol] = {}
        self._keep_bytes = keep_bytes
        self.computations = 0

    def part(
        self, key: object, index: int, compute: Callable[[], Sequence[ir.TensorProtocol]]
    ) -> ir.TensorProtocol:
        """Part `index` of weight `key`, computing all its parts if they are not held."""
        with self._lock:
            kept = self._kept.pop((id(key), index), None)
            if kept is not None:
                return kept
            if self._parts is None or self._key is not key:
                self._set_aside()  # and free the previous weight before computing this one
                self._parts = compute()
                self._key = key
                self._unread = set(range(len(self._parts)))
                self.computations += 1
            part = self._parts[index]
            self._unread.discard(index)
            if not self._unread:
                self._parts, self._key = None, None
            return part

    def _set_aside(self) -> None:
        if self._parts is not None:
            for index in self._unread:
                if self._parts[index].nbytes <= self._keep_bytes:
                    self._kept[(id(self._key), index)] = self._parts[index]
        self._parts, self._key = None, None


@dataclasses.dataclass(frozen=True)
class PartSpec:
    """Name, dtype and shape of one quantized tensor (known before anything is computed)."""

    name: str
    dtype: ir.DataType
    shape: tuple[int, ...]


def lazy_parts(
    cache: OneWeightCache,
    specs: Sequence[PartSpec],
    compute: Callable[[], Sequence[ir.TensorProtocol]],
) -> list[ir.LazyTensor]:
    """One lazy tensor per spec; evaluating any of them runs `compute` through `cache`."""
    key = object()  # identity of this weight in the cache
    return [
        ir.LazyTensor(
            _part_function(cache, key, index, compute),
            dtype=spec.dtype,
            shape=ir.Shape(spec.shape),
            name=spec.name,
        )
        for index, spec in enumerate(specs)
    ]


def _part_function(
    cache: OneWeightCache,
    key: object,
    index: int,
    compute: Callable[[], Sequence[ir.TensorProtocol]],
) -> Callable[[], ir.TensorProtocol]:
    def evaluate() -> ir.TensorProtocol:
        return cache.part(key, index, compute)

    return evaluate
