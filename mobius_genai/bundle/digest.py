"""Save a built model and hash its external data file as it is written.

The manifest records the sha256 of every bundle file; hashing model.onnx.data after saving
reads the file again (~1 s per 2 GB). Instead, each tensor's bytes are hashed right after they
are written, in a background thread that overlaps with reading and converting the next tensor.

onnx-ir writes the external data one tensor after another at increasing, dense offsets (no
alignment padding by default), so the hash of the tensors' bytes in write order is the hash of
the file. The result is handed to the manifest's hash cache (`remember_sha256`) only when the
bytes hashed add up to the file's size; otherwise (sub-byte dtypes, whose bytes are packed on
write, or a layout with gaps) nothing is remembered and the manifest hashes the file itself.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx_ir as ir

from mobius_genai.build import MODEL_FILENAME, ModelPackage
from mobius_genai.bundle.manifest import remember_sha256

#: Tensors waiting to be hashed at most: bounds the memory they hold on to.
_QUEUE = 2


class _Hasher:
    """sha256 of byte buffers fed in order, computed in a thread (hashlib releases the GIL)."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.size = 0
        self.valid = True
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(_QUEUE)
        self._thread = threading.Thread(target=self._run, name="sha256-save", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            self.digest.update(data)

    def feed(self, tensor: ir.TensorProtocol, offset: int) -> None:
        """Hash `tensor`'s bytes, written at `offset`: valid only right after the last ones."""
        if not self.valid:
            return
        packed_or_strings = tensor.dtype.bitwidth < 8 or tensor.dtype == ir.DataType.STRING
        if offset != self.size or packed_or_strings:  # a gap, or bytes not numpy's own
            self.valid = False
            return
        data = np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8)
        if data.dtype.byteorder == ">":  # onnx-ir writes little-endian
            self.valid = False
            return
        self.size += data.size
        self._queue.put(data)

    def finish(self) -> str:
        self._queue.put(None)
        self._thread.join()
        return self.digest.hexdigest()


class _HashedTensor(ir.Tensor):
    """An in-memory tensor that also feeds its bytes to a hasher when written to a file."""

    def __init__(self, tensor: ir.TensorProtocol, hasher: _Hasher) -> None:
        super().__init__(tensor.numpy(), dtype=tensor.dtype, name=tensor.name)
        self._hasher = hasher

    def tofile(self, file) -> None:
        offset = file.tell()
        super().tofile(file)
        self._hasher.feed(self, offset)


def _hashing(tensor: ir.TensorProtocol, hasher: _Hasher) -> ir.LazyTensor:
    """A lazy tensor equal to `tensor` whose bytes are hashed when saved."""
    return ir.LazyTensor(
        lambda: _HashedTensor(tensor, hasher),
        dtype=tensor.dtype,
        shape=tensor.shape,
        name=tensor.name,
    )


def _external_values(model: ir.Model, threshold: int) -> Iterator[ir.Value]:
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is not None and tensor.nbytes > threshold:
                yield value


def save_with_digest(built: ModelPackage, folder: Path, progress: bool = True) -> None:
    """`built.save(folder)`, hashing the decoder's external data file while it is written."""
    model = built.models.get("model")
    if model is None:
        built.save(folder, progress=progress)
        return
    hasher = _Hasher()
    originals = {value: value.const_value for value in _external_values(model, 256)}
    for value, tensor in originals.items():
        value.const_value = _hashing(tensor, hasher)  # type: ignore[arg-type]
    try:
        built.save(folder, progress=progress)
    finally:
        for value, tensor in originals.items():
            value.const_value = tensor
        digest = hasher.finish()
    data = folder / f"{MODEL_FILENAME}.data"
    if hasher.valid and data.is_file() and data.stat().st_size == hasher.size:
        remember_sha256(data, digest)
