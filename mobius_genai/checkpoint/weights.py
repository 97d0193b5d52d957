"""Checkpoint weights: a safetensors `Checkpoint` (a `reader.CheckpointReader`), and the lazy
value of one graph parameter read from any reader (`lazy_tensor`), cast without a copy.

Each graph parameter becomes an `ir.LazyTensor` that reads its one tensor from the memory-mapped
safetensors file only when it is saved (or folded), so a build holds at most a few tensors in
memory at a time, never the model. A matrix taken from the checkpoint as it is (cast, perhaps
transposed or sliced) is a `CheckpointTensor`, which can also be read a block of rows at a
time: saving it and quantizing it then never hold the whole matrix. Pickled `.bin` checkpoints
are refused: loading them would execute code from the checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PureWindowsPath
from typing import BinaryIO

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai._buffers import BufferPool
from mobius_genai._json import read_json_object
from mobius_genai.checkpoint import _safetensors
from mobius_genai.checkpoint._safetensors import TensorEntry, shown
from mobius_genai.checkpoint.checks import require_finite, sliced_shape
from mobius_genai.checkpoint.file_rows import READABLE, StoredRows, widen_bf16
from mobius_genai.checkpoint.prequantized.bitnet import BitNetScheme
from mobius_genai.checkpoint.prequantized.gptq import QuantizationScheme
from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor
from mobius_genai.checkpoint.reader import (
    TRANSPOSED_FROM_CHECKPOINT,
    CheckpointName,
    CheckpointReader,
    ModelConfig,
    TensorSource,
)
from mobius_genai.checkpoint.source import checkpoint_file
from mobius_genai.errors import WeightsError

_INDEX = "model.safetensors.index.json"
#: Elements read at a time when a large tensor is streamed (row blocks of the checkpoint).
STREAM_ELEMENTS = 1 << 24
#: A transposed matrix (its saved rows are the checkpoint's columns) is saved from windows of
#: the checkpoint's columns of at most this many bytes in the checkpoint's dtype, each filled a
#: band of stored rows at a time: a 1 GiB LM head never needs more than one window in memory.
TRANSPOSE_WINDOW_BYTES = 256 << 20


#: safetensors dtypes a floating-point parameter may be read from (and cast).
_FLOAT_STORED = frozenset({"F16", "BF16", "F32", "F64"})


class Checkpoint:
    """The tensors of a safetensors checkpoint (one file, or shards with an index).

    Every file's header is parsed and checked once, here; tensors are then read from their
    offsets. With model.safetensors.index.json, its weight_map says which shard holds each
    tensor and a tensor the weight_map does not name is not read (transformers loads every
    tensor of every shard the index names, a later shard's copy replacing an earlier one's);
    without an index, a tensor found in two files is refused, as nothing says which to read.
    """

    def __init__(
        self,
        folder: str | Path,
        scheme: QuantizationScheme | BitNetScheme | None = None,
        *,
        mxfp4_experts: bool = False,
    ) -> None:
        self.folder = Path(folder)
        self.scheme = scheme
        """How config.json says the linear weights are stored as integers (GPTQ, AWQ, BitNet)."""
        self.mxfp4_experts = mxfp4_experts
        self._entries: dict[str, tuple[Path, TensorEntry]] = {}
        index = self.folder / _INDEX
        self._files = self._read_index(index) if index.is_file() else self._read_files()

    def _read_index(self, index: Path) -> list[Path]:
        """The shards `index` names, with the tensors its weight_map places in each."""
        weight_map = read_json_object(index, WeightsError).get("weight_map")
        accepted = "accepted: an object mapping each tensor name to its shard's file name"
        if not isinstance(weight_map, dict):
            found = "has no weight_map" if weight_map is None else f"weight_map {shown(weight_map)}"
            raise WeightsError(f"{index}: {found}; {accepted}")
        for name, shard in weight_map.items():
            if not isinstance(shard, str):
                raise WeightsError(
                    f"{index}: weight_map maps {shown(name)} to {shown(shard)}; {accepted}"
                )
        shards = sorted(set(weight_map.values()))
        outside = [shard for shard in shards if not _inside_folder(shard)]
        if outside:
            raise WeightsError(
                f"{index}: names shards outside the checkpoint folder: {shown(outside)}; "
                "accepted: file names in the folder"
            )
        files = {shard: self.folder / shard for shard in shards}
        for file in files.values():
            checkpoint_file(file, self.folder, WeightsError)  # no link out of the checkpoint
        missing = [shard for shard, file in files.items() if not file.is_file()]
        if missing:
            raise WeightsError(f"{index}: names shards that are missing: {shown(missing)}")
        headers = {shard: _safetensors.read_header(file) for shard, file in files.items()}
        for name, shard in weight_map.items():
            entry = headers[shard].get(name)
            if entry is None:
                raise WeightsError(
                    f"{index}: weight_map places tensor {shown(name)} in {shard}, which does "
                    "not hold it"
                )
            self._entries[name] = (files[shard], entry)
        return list(files.values())

    def _read_files(self) -> list[Path]:
        """The folder's safetensors files, with their tensors (each in one file only)."""
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            pickled = sorted(p.name for p in self.folder.glob("*.bin"))
            if pickled:
                raise WeightsError(
                    f"{self.folder}: only pickled weights found ({pickled[0]}); they are not "
                    "loaded because unpickling can run code; accepted: *.safetensors"
                )
            raise WeightsError(f"{self.folder}: no *.safetensors weight files found")
        for file in files:
            checkpoint_file(file, self.folder, WeightsError)  # no link out of the checkpoint
            for name, entry in _safetensors.read_header(file).items():
                if name in self._entries:
                    raise WeightsError(
                        f"{self.folder}: tensor {shown(name)} is in both "
                        f"{self._entries[name][0].name} and {file.name}; accepted: each tensor "
                        f"in one file, or {_INDEX} saying which file holds it"
                    )
                self._entries[name] = (file, entry)
        return files

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def files(self) -> list[Path]:
        return sorted(self._files)

    def read(self, name: str, index: tuple[slice, ...] | None = None) -> np.ndarray:
        """The tensor `name` as a new numpy array (bf16 as ml_dtypes.bfloat16).

        With `index`, only that slice is read from the file. No page of the file stays in
        memory after the read (see `_safetensors.read_tensor`).
        """
        if name not in self._entries:
            raise WeightsError(f"{self.folder}: tensor {name!r} not found in the checkpoint")
        file, entry = self._entries[name]
        return _safetensors.read_tensor(file, entry, index)

    def dtype(self, name: str) -> str:
        """The stored dtype as safetensors names it ("BF16", "F32", ...)."""
        return self._entries[name][1].dtype

    def location(self, name: str) -> tuple[Path, TensorEntry]:
        """The file holding tensor `name` and its entry (dtype, shape, offset in the file)."""
        return self._entries[name]

    def kind(self, name: str) -> str:
        """The stored kind of tensor `name` for reports: its safetensors dtype."""
        return self.dtype(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1].shape

    def describe(self) -> str | None:
        """The GPTQ / AWQ / BitNet scheme in words; None for float weights (MXFP4 experts included:
        they are read as float)."""
        return None if self.scheme is None else self.scheme.describe()

    def stored_bits(self) -> frozenset[int]:
        return frozenset() if self.scheme is None else frozenset({self.scheme.bits})

    def stored_integers(
        self, parameters: Mapping[str, ir.Value], checkpoint_name: CheckpointName
    ) -> tuple[dict[str, PrequantizedTensor], list[str]]:
        """The GPTQ / AWQ / BitNet weights as their stored integers (the scheme's)."""
        if self.scheme is None:
            return {}, []
        return self.scheme.stored_tensors(parameters, self, checkpoint_name)


def _inside_folder(shard: str) -> bool:
    """Whether the shard an index names lies in the checkpoint folder, judged on the name.

    The name is normalized lexically: it may not be absolute (a root, a drive, a share) or
    climb out with "..", on Windows or POSIX alike. Symlinks in the folder are followed when
    the file is read: the hub cache's snapshot files are links into ../../blobs/.
    """
    path = PureWindowsPath(shard)  # splits on "/" and "\\", and sees drives and roots
    if path.anchor:
        return False
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 1
        if depth < 0:
            return False
    return True


Preprocess = Callable[[str, np.ndarray, ModelConfig], np.ndarray]


def no_preprocess(name: str, array: np.ndarray, config: ModelConfig) -> np.ndarray:
    """The preprocess of families that take checkpoint tensors as they are.

    With it, large tensors are read and cast in row blocks (never whole in the checkpoint's
    dtype and the graph's at once).
    """
    return array


def lazy_tensor(
    checkpoint: CheckpointReader,
    config: ModelConfig,
    parameters: Mapping[str, ir.Value],
    name: str,
    source: TensorSource,
    found: str,
    preprocess: Preprocess,
) -> ir.TensorProtocol:
    """The lazy value of parameter `name` from checkpoint tensor `found`, its shape and dtype
    checked against the parameter's."""
    value = parameters[name]
    transposed = bool(value.meta.get(TRANSPOSED_FROM_CHECKPOINT)) and not source.in_out
    expected = tuple(value.shape.numpy())
    stored = checkpoint.shape(found)
    index = _part_index(source, name, parameters, transposed, stored, checkpoint, found)
    sliced = sliced_shape(stored, index)
    if (tuple(reversed(sliced)) if transposed else sliced) != expected:
        needed = list(reversed(expected)) if transposed else list(expected)
        part = f" (part {name!r} at {index})" if index is not None else ""
        raise WeightsError(
            f"{checkpoint.folder}: tensor {found!r}{part} has shape {list(sliced)}, the "
            f"architecture in config.json needs {needed}"
        )
    stored_dtype = checkpoint.dtype(found)
    if value.dtype.is_floating_point() and stored_dtype not in _FLOAT_STORED:
        raise WeightsError(
            f"{checkpoint.folder}: tensor {found!r} is stored as {stored_dtype}; parameter "
            f"{name!r} is floating point, accepted: {', '.join(sorted(_FLOAT_STORED))}"
        )
    load = _loader(checkpoint, found, index, name, value.dtype, transposed, config, preprocess)
    if preprocess is no_preprocess and len(sliced) == 2:
        return CheckpointTensor(
            load, checkpoint, found, index, value.dtype, expected, name, transposed
        )
    return ir.LazyTensor(load, dtype=value.dtype, shape=ir.Shape(expected), name=name)


def _part_index(
    source: TensorSource,
    name: str,
    parameters: Mapping[str, ir.Value],
    transposed: bool,
    stored: tuple[int, ...],
    checkpoint: CheckpointReader,
    found: str,
) -> tuple[slice, ...] | None:
    """The slice of the stored tensor that holds parameter `name`, or None for all of it."""
    if not source.parts:
        return None
    axis = source.axis % len(stored)
    start = total = 0
    own = None
    for part in source.parts:
        value = parameters.get(part)
        if value is None or value.shape is None:
            raise WeightsError(
                f"{checkpoint.folder}: tensor {found!r} is split into graph parameters "
                f"{list(source.parts)}, but the graph has no parameter {part!r}"
            )
        shape = tuple(value.shape.numpy())
        extent = (tuple(reversed(shape)) if transposed else shape)[axis]
        if part == name:
            start = total
            own = extent
        total += extent
    if own is None:
        raise WeightsError(f"graph parameter {name!r} is not among the parts {list(source.parts)}")
    if total != stored[axis]:
        raise WeightsError(
            f"{checkpoint.folder}: tensor {found!r} has {stored[axis]} entries along axis "
            f"{axis}, its parts {list(source.parts)} need {total}"
        )
    index = [slice(None)] * len(stored)
    index[axis] = slice(start, start + own)
    return tuple(index)


def _loader(
    checkpoint: CheckpointReader,
    source: str,
    index: tuple[slice, ...] | None,
    name: str,
    dtype: ir.DataType,
    transposed: bool,
    config: ModelConfig,
    preprocess: Preprocess,
) -> Callable[[], ir.TensorProtocol]:
    def load() -> ir.TensorProtocol:
        shape = checkpoint.shape(source)
        if (
            preprocess is no_preprocess
            and index is None
            and len(shape) == 2
            and math.prod(shape) > STREAM_ELEMENTS
            and checkpoint.dtype(source) == "BF16"
            and dtype == ir.DataType.FLOAT
        ):
            widened = _stream_bf16_to_f32(checkpoint, source, shape, transposed, name)
            return ir.Tensor(widened, name=name)
        array = checkpoint.read(source) if index is None else checkpoint.read(source, index)
        array = _cast(preprocess(name, array, config), dtype.numpy(), transposed)
        require_finite(array, checkpoint, source, index, name)
        return ir.Tensor(array, name=name)

    return load


def _cast(array: np.ndarray, dtype: np.dtype, transposed: bool) -> np.ndarray:
    """`array` (transposed if asked) as a contiguous array of `dtype`, in one pass.

    bfloat16 → float32 moves each value's 16 bits into the high half of a 32-bit word,
    transposing the 2-byte values first: exact, and several times faster than the cast.
    """
    if array.dtype == ml_dtypes.bfloat16 and dtype == np.float32:
        bits = array.view(np.uint16)
        bits = bits.T if transposed else bits
        widened = np.empty(bits.shape, np.uint32)
        widen_bf16(bits, widened)
        return widened.view(np.float32)
    if transposed:
        array = array.T
    with np.errstate(over="ignore"):  # values beyond dtype's range: require_finite names them
        return np.ascontiguousarray(array.astype(dtype, copy=False))


def _stream_bf16_to_f32(
    checkpoint: CheckpointReader,
    name: str,
    shape: tuple[int, ...],
    transposed: bool,
    parameter: str,
) -> np.ndarray:
    """A 2-D bf16 tensor as float32 (transposed if asked), read in row blocks.

    Only the float32 result and one block are in memory at a time; each block is read through
    a memory map of its own, so no page of the checkpoint stays resident.
    """
    rows, columns = shape
    out = np.empty((columns, rows) if transposed else (rows, columns), np.uint32)
    step = max(1, STREAM_ELEMENTS // columns)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block = checkpoint.read(name, (slice(start, stop), slice(None)))
        require_finite(block, checkpoint, name, None, parameter)  # widening keeps every value
        bits = block.view(np.uint16)
        widen_bf16(
            bits.T if transposed else bits, out[:, start:stop] if transposed else out[start:stop]
        )
    return out.view(np.float32)


def _convert_into(stored: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = stored`` cast to out's dtype; `stored` may be a strided (transposed) view.

    bfloat16 → float32 widens the bits (exact, and several times faster than numpy's cast).
    """
    if stored.dtype == ml_dtypes.bfloat16 and out.dtype == np.float32:
        widen_bf16(stored.view(np.uint16), out.view(np.uint32))
    else:
        with np.errstate(over="ignore"):  # values beyond out's range: require_finite names them
            np.copyto(out, stored, casting="unsafe")


class CheckpointTensor(ir.LazyTensor):
    """A 2-D graph parameter whose value is a checkpoint matrix: cast, sliced, maybe transposed.

    Like any lazy tensor, `numpy()` reads it whole. `blocks()` yields it a block of rows at a
    time in the graph's layout, converted into reused buffers (what saving needs), and
    `stored_rows()` reads rows of the matrix as the checkpoint stores them: for a transposed
    Linear weight those are the output features, the rows INT4 quantization works on.
    """

    def __init__(
        self,
        load: Callable[[], ir.TensorProtocol],
        checkpoint: CheckpointReader,
        source: str,
        index: tuple[slice, ...] | None,
        dtype: ir.DataType,
        shape: tuple[int, ...],
        name: str,
        transposed: bool,
    ) -> None:
        super().__init__(load, dtype=dtype, shape=ir.Shape(shape), name=name)
        self.checkpoint = checkpoint
        self.source = source
        self.index = index
        self.transposed = transposed
        """The graph holds the transpose of the stored matrix ([in, out] of a Linear weight)."""

    @property
    def stored_shape(self) -> tuple[int, int]:
        """[rows, columns] of the matrix as stored (after slicing)."""
        rows, columns = (int(d) for d in self.shape)
        return (columns, rows) if self.transposed else (rows, columns)

    def _read_stored(self, start: int, stop: int) -> np.ndarray:
        """Stored rows [start, stop), in the checkpoint's dtype."""
        rows, columns = (slice(None), slice(None)) if self.index is None else self.index
        first = rows.start or 0
        return self.checkpoint.read(self.source, (slice(first + start, first + stop), columns))

    def stored_rows(self, start: int, stop: int, *, transpose: bool = False) -> np.ndarray:
        """Stored rows [start, stop) in the graph's dtype, contiguous; [columns, rows] if
        `transpose`."""
        stored = self._read_stored(start, stop)
        stored = stored.T if transpose else stored
        out = np.empty(stored.shape, self.dtype.numpy())
        _convert_into(stored, out)
        self._check_finite(out)
        return out

    def stored_rows_in_file(self, start: int, stop: int) -> StoredRows | None:
        """Stored rows [start, stop) as another process reads them from the safetensors file
        itself (`file_rows.StoredRows`: the int4 search's workers); None where the matrix is
        not in a safetensors file as BF16, F16 or F32."""
        if not isinstance(self.checkpoint, Checkpoint):
            return None
        file, entry = self.checkpoint.location(self.source)
        if entry.dtype not in READABLE or len(entry.shape) != 2:
            return None
        rows, columns = (slice(None), slice(None)) if self.index is None else self.index
        first, column = rows.start or 0, columns.start or 0
        return StoredRows(
            str(file.absolute()),
            entry.offset,
            entry.dtype,
            (int(entry.shape[0]), int(entry.shape[1])),
            first + start,
            first + stop,
            column,
            column + self.stored_shape[1],
        )

    def _check_finite(self, values: np.ndarray) -> None:
        require_finite(values, self.checkpoint, self.source, self.index, str(self.name))

    def blocks(self, pool: BufferPool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(bytes, buffer) pairs that concatenate to the saved tensor; give each buffer back.

        Each block is a run of whole rows of the graph's layout converted into a buffer taken
        from `pool` (a row larger than the pool's buffers gets a buffer of its own size). A
        transposed matrix is read a window of stored columns at a time (`_stored_columns`).
        """
        rows, columns = (int(d) for d in self.shape)
        dtype = np.dtype(self.dtype.numpy())
        step = max(1, pool.nbytes // max(1, columns * dtype.itemsize))
        window = rows
        if self.transposed:
            stored_bytes = columns * _safetensors.itemsize(self.checkpoint.dtype(self.source))
            window = max(step, TRANSPOSE_WINDOW_BYTES // stored_bytes // step * step)
        for first in range(0, rows, window):
            last = min(rows, first + window)
            whole = self._stored_columns(first, last).T if self.transposed else None
            for start in range(first, last, step):
                stop = min(last, start + step)
                stored = (
                    self._read_stored(start, stop)
                    if whole is None
                    else whole[start - first : stop - first]
                )
                size = (stop - start) * columns * dtype.itemsize
                buffer = pool.take(size)
                block = buffer[:size].view(dtype).reshape(stop - start, columns)
                _convert_into(stored, block)
                try:
                    self._check_finite(block)
                except WeightsError:
                    pool.give(buffer)
                    raise
                yield buffer[:size], buffer

    def _stored_columns(self, start: int, stop: int) -> np.ndarray:
        """Stored columns [start, stop) of every stored row, in the checkpoint's dtype.

        Read in bands of STREAM_ELEMENTS stored rows, each through a map of its own, so only
        the window and one band are ever resident, however large the matrix.
        """
        rows, columns = self.stored_shape
        row_slice, column_slice = (slice(None), slice(None)) if self.index is None else self.index
        first_row, first_column = row_slice.start or 0, column_slice.start or 0
        wanted = slice(first_column + start, first_column + stop)
        band = max(1, STREAM_ELEMENTS // columns)
        out = None
        for row in range(0, rows, band):
            end = min(rows, row + band)
            rows_read = slice(first_row + row, first_row + end)
            part = self.checkpoint.read(self.source, (rows_read, wanted))
            if out is None:
                out = np.empty((rows, stop - start), part.dtype)
            out[row:end] = part
        return out

    def tofile(self, file: BinaryIO) -> None:
        """Write the tensor's bytes to `file` a block at a time."""
        pool = BufferPool(limit=1)
        for data, buffer in self.blocks(pool):
            file.write(data)
            pool.give(buffer)


class ConcatTensor(ir.LazyTensor):
    """A tensor equal to ``concatenate(parts, axis)``, computed when first read.

    The parts stay visible (`parts`, `axis`), so a reader that can take them one at a time
    (INT4 quantization reading checkpoint rows) need not concatenate them.
    """

    def __init__(
        self, parts: Sequence[ir.TensorProtocol], axis: int, dtype: ir.DataType, name: str
    ) -> None:
        shape = [int(d) for d in parts[0].shape]
        shape[axis] = sum(int(part.shape[axis]) for part in parts)
        super().__init__(self._load, dtype=dtype, shape=ir.Shape(shape), name=name)
        self.parts = tuple(parts)
        self.axis = axis

    def _load(self) -> ir.TensorProtocol:
        arrays = [part.numpy() for part in self.parts]
        return ir.Tensor(np.concatenate(arrays, axis=self.axis), dtype=self.dtype, name=self.name)
