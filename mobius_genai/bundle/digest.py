"""Save a built model, writing and hashing its external data in background threads.

The manifest records the sha256 of every bundle file; hashing model.onnx.data after saving
reads the file again (~1 s per 2 GB). Instead the external data goes through a pipeline of
three threads: the saving thread reads and converts each tensor (checkpoint matrices a block at
a time, into reused buffers: `CheckpointTensor.blocks`; stacked MoE experts an expert at a time:
`chunks()`), a writer thread writes each block at
its offset, and a hasher thread hashes the blocks in order. Reading, writing and hashing then
overlap instead of following each other.

onnx-ir writes the external data one tensor after another at increasing, dense offsets (no
alignment padding by default), so the hash of the blocks in order is the hash of the file. The
result is handed to the manifest's hash cache (`remember_sha256`) only when the bytes hashed
add up to the file's size; otherwise (a layout with gaps) nothing is remembered and the
manifest hashes the file itself.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path

import numpy as np
import onnx_ir as ir

from mobius_genai._buffers import BLOCK_BYTES, BufferPool
from mobius_genai.build import EXTERNAL_THRESHOLD, MODEL_FILENAME, ModelPackage
from mobius_genai.bundle.manifest import remember_sha256
from mobius_genai.checkpoint.weights import CheckpointTensor
from mobius_genai.errors import BundleError

#: Blocks queued between two threads at most (tensors not in pooled buffers are bounded by it).
_QUEUE = 4
#: Writes at an offset without moving the file position (POSIX `pwrite`) can run in a thread
#: of their own; elsewhere (Windows) the saving thread writes and only hashing runs behind it.
_BACKGROUND_WRITES = hasattr(os, "pwrite")
#: Pooled block buffers in flight at most (with BLOCK_BYTES each).
_BUFFERS = 6

_Block = tuple[int, np.ndarray, "np.ndarray | None"]
"""(file offset, bytes, pooled buffer to give back or None)"""


class _Pipeline:
    """Writes blocks at their offsets (writer thread) and hashes them in order (hasher thread).

    A failed write is kept and raised by `put()` and `close()`; blocks after it are still
    passed along (not written) so that every pooled buffer is given back. Without background
    writes, `put()` writes in the calling thread, at the file's position.
    """

    def __init__(self, pool: BufferPool, background_writes: bool | None = None) -> None:
        self.pool = pool
        self.background_writes = (
            _BACKGROUND_WRITES if background_writes is None else background_writes
        )
        self.digest = hashlib.sha256()
        self.size = 0
        self.in_order = True
        self.error: OSError | None = None
        self._fd: int | None = None
        self._file: object = None
        self._writes: queue.Queue[_Block | None] = queue.Queue(_QUEUE)
        self._hashes: queue.Queue[_Block | None] = queue.Queue(_QUEUE)
        self._threads = [
            threading.Thread(target=self._write_loop, name="save-write", daemon=True),
            threading.Thread(target=self._hash_loop, name="save-sha256", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def put(self, file, offset: int, data: np.ndarray, buffer: np.ndarray | None) -> None:
        """Queue `data` (contiguous uint8) to be written at `offset` of `file`'s file."""
        if self.error is not None:
            raise self.error
        if self._file is None:
            self._file = file
            if self.background_writes:
                # A descriptor of our own: onnx-ir closes its file before the writes drain.
                self._fd = os.dup(file.fileno())
        elif file is not self._file:
            raise BundleError("the external data must be saved to one file (no shards)")
        if offset != self.size:  # a gap: the blocks' hash is not the file's
            self.in_order = False
        self.size = offset + data.size
        if self.background_writes:
            self._writes.put((offset, data, buffer))
            return
        try:
            file.write(data)
        except OSError as error:
            self.error = error
            raise
        finally:
            self._hashes.put((offset, data, buffer))

    def _write_loop(self) -> None:
        while (block := self._writes.get()) is not None:
            offset, data, _ = block
            if self.error is None:
                try:
                    view = memoryview(data)
                    while view:
                        written = os.pwrite(self._fd, view, offset)  # type: ignore[arg-type]
                        view, offset = view[written:], offset + written
                except OSError as error:
                    self.error = error
            self._hashes.put(block)
        self._hashes.put(None)

    def _hash_loop(self) -> None:
        while (block := self._hashes.get()) is not None:
            _, data, buffer = block
            if self.in_order:
                self.digest.update(data)
            if buffer is not None:
                self.pool.give(buffer)

    def close(self, raise_error: bool = True) -> None:
        """Wait for every queued block to be written and hashed; raise a failed write."""
        self._writes.put(None)
        for thread in self._threads:
            thread.join()
        if self._fd is not None:
            os.close(self._fd)
        if raise_error and self.error is not None:
            raise self.error


class _PipelinedTensor(ir.LazyTensor):
    """`tensor`, whose bytes go through the pipeline when onnx-ir writes it to a file."""

    def __init__(self, tensor: ir.TensorProtocol, pipeline: _Pipeline) -> None:
        super().__init__(lambda: tensor, dtype=tensor.dtype, shape=tensor.shape, name=tensor.name)
        self._tensor = tensor
        self._pipeline = pipeline

    def tofile(self, file) -> None:
        offset = file.tell()
        if isinstance(self._tensor, CheckpointTensor):
            for data, buffer in self._tensor.blocks(self._pipeline.pool):
                self._pipeline.put(file, offset, data, buffer)
                offset += data.size
        elif hasattr(self._tensor, "chunks"):  # stacked experts, made one expert at a time
            for chunk in self._tensor.chunks():
                offset = self._put_pooled(file, offset, chunk)
        else:
            data = _bytes_of(self._tensor)
            self._pipeline.put(file, offset, data, None)
            offset += data.size
        file.seek(offset)

    def _put_pooled(self, file, offset: int, chunk: np.ndarray) -> int:
        """Queue `chunk`'s bytes through pooled buffers (the pool bounds what is in flight)."""
        data = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
        for start in range(0, data.size, BLOCK_BYTES):
            piece = data[start : start + BLOCK_BYTES]
            buffer = self._pipeline.pool.take(piece.size)
            buffer[: piece.size] = piece
            self._pipeline.put(file, offset, buffer[: piece.size], buffer)
            offset += piece.size
        return offset


def _bytes_of(tensor: ir.TensorProtocol) -> np.ndarray:
    """The bytes onnx-ir writes for `tensor`, as uint8, without a copy where numpy has them.

    Sub-byte dtypes (packed two per byte on write), strings and big-endian arrays go through
    `tobytes()`, onnx-ir's own encoding.
    """
    if tensor.dtype.bitwidth >= 8 and tensor.dtype != ir.DataType.STRING:
        array = tensor.numpy()
        if array.dtype.byteorder != ">":
            return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return np.frombuffer(tensor.tobytes(), np.uint8)


def _external_values(model: ir.Model, threshold: int) -> list[ir.Value]:
    return [
        value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if value.const_value is not None and value.const_value.nbytes > threshold
    ]


def _restore(originals: dict[ir.Value, ir.TensorProtocol]) -> None:
    for value, tensor in originals.items():
        value.const_value = tensor


def save_with_digest(
    built: ModelPackage, folder: Path, progress: bool = True, action: str = "saving"
) -> None:
    """`built.save(folder)`, the decoder's external data written and hashed in the background
    (`action`: the phase's name, see `ModelPackage.save`)."""
    model = built.models.get("model")
    if model is None:
        built.save(folder, progress=progress, action=action)
        return
    pipeline = _Pipeline(BufferPool(limit=_BUFFERS))
    originals = {value: value.const_value for value in _external_values(model, EXTERNAL_THRESHOLD)}
    for value, tensor in originals.items():
        value.const_value = _PipelinedTensor(tensor, pipeline)  # type: ignore[arg-type]
    data = folder / f"{MODEL_FILENAME}.data"
    try:
        built.save(folder, progress=progress, action=action)
    except BaseException as error:
        _restore(originals)
        pipeline.close(raise_error=False)
        if error is pipeline.error:
            raise BundleError(f"{data}: writing failed ({error})") from error
        raise  # the save's own error
    _restore(originals)
    try:
        pipeline.close()
    except OSError as error:
        raise BundleError(f"{data}: writing failed ({error})") from error
    if pipeline.in_order and data.is_file() and data.stat().st_size == pipeline.size:
        remember_sha256(data, pipeline.digest.hexdigest())
