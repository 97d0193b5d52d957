"""Checkpoint matrices read a block at a time give the bytes of reading them whole.

`CheckpointTensor.blocks()` is what saving writes and `stored_rows()` what INT4 quantization
reads; both must equal `numpy()` (the whole read, itself checked against transformers by the
parity tests) for every layout: cast, transposed (Linear weights), sliced (fused checkpoint
tensors split into graph parameters, along either axis).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
import safetensors.numpy

import mobius_genai
from mobius_genai._buffers import BufferPool
from mobius_genai.checkpoint import weights
from mobius_genai.checkpoint.weights import CheckpointTensor
from tests._hf import write_tiny_checkpoint
from tests.conftest import TINY_QWEN2


def _checkpoint_tensors(folder: Path, dtype: str) -> dict[str, CheckpointTensor]:
    built = mobius_genai.build(folder, "default", dtype)
    tensors = {
        name: value.const_value
        for name, value in built["model"].graph.initializers.items()
        if isinstance(value.const_value, CheckpointTensor)
    }
    assert tensors, "no checkpoint matrices found"
    return tensors


def _saved_bytes(tensor: CheckpointTensor, pool: BufferPool) -> bytes:
    parts = []
    for data, buffer in tensor.blocks(pool):
        parts.append(bytes(data))
        pool.give(buffer)
    return b"".join(parts)


def _check_blocks_and_rows(tensor: CheckpointTensor, pool: BufferPool) -> None:
    whole = tensor.numpy()
    assert _saved_bytes(tensor, pool) == whole.tobytes()
    stored = whole.T if tensor.transposed else whole
    assert tuple(stored.shape) == tensor.stored_shape
    rows = max(1, stored.shape[0] // 3)
    for start in (0, rows):
        got = tensor.stored_rows(start, start + rows)
        assert got.dtype == whole.dtype
        np.testing.assert_array_equal(got, stored[start : start + rows])
        flipped = tensor.stored_rows(start, start + rows, transpose=True)
        assert flipped.flags.c_contiguous
        np.testing.assert_array_equal(flipped, stored[start : start + rows].T)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("buffer_bytes", [100, 1000, 1 << 20])
def test_blocks_and_rows_equal_the_whole_read(dtype: str, buffer_bytes: int):
    """bf16 checkpoint → f32 (widened) or f16 (cast); 100-byte buffers are smaller than one
    row (a buffer of the row's size is taken), 1 MiB ones hold whole tensors."""
    pool = BufferPool(nbytes=buffer_bytes, limit=1)
    tensors = _checkpoint_tensors(TINY_QWEN2, dtype)
    assert any(t.transposed for t in tensors.values())
    assert any(not t.transposed for t in tensors.values())  # the embedding table
    for name, tensor in tensors.items():
        try:
            _check_blocks_and_rows(tensor, pool)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from error


def _recorded(array: np.ndarray, sizes: list[int]) -> np.ndarray:
    sizes.append(array.nbytes)
    return array


def test_large_transposed_matrices_are_read_in_windows(monkeypatch: pytest.MonkeyPatch):
    """A transposed matrix larger than TRANSPOSE_WINDOW_BYTES is never read whole: every read
    of the checkpoint stays within a window of columns and a band of rows (a 7B model's untied
    LM head is 1 GiB; converting it whole cost `package` 3 GiB)."""
    tensors = [t for t in _checkpoint_tensors(TINY_QWEN2, "f32").values() if t.transposed]
    wholes = [t.numpy().tobytes() for t in tensors]
    checkpoint = tensors[0].checkpoint
    reads: list[int] = []
    read = checkpoint.read
    monkeypatch.setattr(checkpoint, "read", lambda *a: _recorded(read(*a), reads))
    monkeypatch.setattr(weights, "TRANSPOSE_WINDOW_BYTES", 96)
    monkeypatch.setattr(weights, "STREAM_ELEMENTS", 64)
    pool = BufferPool(nbytes=512, limit=1)
    for tensor, whole in zip(tensors, wholes, strict=True):
        assert tensor.checkpoint is checkpoint
        reads.clear()
        assert _saved_bytes(tensor, pool) == whole
        band = max(64, tensor.stored_shape[1]) * 2  # bf16: a band of rows, or one row
        assert len(reads) > 2 and max(reads) <= band, (tensor.name, reads)


def test_tofile_writes_the_tensor():
    for tensor in _checkpoint_tensors(TINY_QWEN2, "f32").values():
        file = io.BytesIO()
        tensor.tofile(file)
        assert file.getvalue() == tensor.numpy().tobytes()


@pytest.mark.parametrize("family", ["phi3", "gpt2"])
def test_slices_of_fused_checkpoint_tensors(family: str, tmp_path: Path):
    """phi3's qkv_proj / gate_up_proj are split along the checkpoint's rows, gpt2's c_attn
    (Conv1D, stored [in, out]) along its columns."""
    folder = write_tiny_checkpoint(tmp_path / family, family, seed=1)
    tensors = _checkpoint_tensors(folder, "f32")
    sliced = {name: t for name, t in tensors.items() if t.index is not None}
    assert len(sliced) >= 3, sorted(tensors)
    pool = BufferPool(nbytes=700, limit=1)
    for name, tensor in sliced.items():
        try:
            _check_blocks_and_rows(tensor, pool)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from error


def test_the_pool_bounds_buffers_and_reuses_them():
    pool = BufferPool(nbytes=64, limit=2)
    first, second = pool.take(), pool.take(200)
    assert first.size == 64 and second.size == 200
    pool.give(second)
    assert pool.take() is second  # the most recently given back, warm in the caches
    pool.give(first)
    assert pool.take(100).size == 100  # first is too small for the request: a new buffer


def test_a_family_preprocess_keeps_its_tensors_whole_and_the_others_in_blocks(tmp_path: Path):
    """gemma offsets its norm weights (1 + w): those are read whole through the hook, every
    matrix is a CheckpointTensor, and the values are those of reading everything whole."""
    folder = write_tiny_checkpoint(tmp_path / "gemma", "gemma", seed=1)
    built = mobius_genai.build(folder, "default", "f32")
    values = {n: v.const_value for n, v in built["model"].graph.initializers.items()}
    norms = {n: t for n, t in values.items() if n.endswith("norm.weight")}
    matrices = {n: t for n, t in values.items() if isinstance(t, CheckpointTensor)}
    assert norms and not any(isinstance(t, CheckpointTensor) for t in norms.values())
    assert all(isinstance(t, ir.LazyTensor) for t in norms.values())
    assert "model.embed_tokens.weight" in matrices and len(matrices) > 5
    stored = safetensors.numpy.load_file(folder / "model.safetensors")
    for name, tensor in norms.items():
        np.testing.assert_array_equal(tensor.numpy(), stored[name] + 1.0, err_msg=name)
    pool = BufferPool(nbytes=1000, limit=1)
    for tensor in matrices.values():
        _check_blocks_and_rows(tensor, pool)
