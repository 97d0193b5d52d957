"""INT4 quantization reads checkpoint matrices a block of stored rows at a time.

A Linear weight stored [out, in] and an embedding table stored [vocab, hidden] have the
MatMulNBits rows (output features) as their stored rows, so `WeightSource.column_reader()`
converts stored row blocks straight into the [K, columns] chunks the kernel takes, without the
whole [K, N] matrix; packed q/k/v (a ConcatTensor of three such matrices) reads its parts the
same way. The bytes must be those of quantizing the whole read.
"""

from __future__ import annotations

import numpy as np
import pytest

import mobius_genai
from mobius_genai.checkpoint.weights import CheckpointTensor, ConcatTensor
from mobius_genai.quantize import layout
from mobius_genai.quantize.weight_uses import find_weights
from tests.conftest import TINY_QWEN2


def _sources(dtype: str):
    """The cpu graph's weights; bf16 on mlx (the cpu EP runs no bf16), which packs nothing."""
    built = mobius_genai.build(TINY_QWEN2, "mlx" if dtype == "bf16" else "cpu", dtype)
    groups, _ = find_weights(built["model"].graph)
    return [group.source for group in groups]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_quantizing_from_stored_rows_gives_the_bytes_of_the_whole_read(dtype: str):
    sources = _sources(dtype)
    assert any(source.stored_nk for source in sources)  # the tied embedding table
    assert any(not source.stored_nk for source in sources)
    packed = [s for s in sources if isinstance(s.values[0].const_value, ConcatTensor)]
    assert len(packed) == (2 if dtype == "f32" else 0)  # q/k/v packed where cpu packs them
    for source in sources:
        whole = source.read()
        numpy_dtype = np.dtype(source.dtype.numpy())
        expected = layout.quantize_matmul_nbits(whole, 32, symmetric=False, chunk_elements=700)
        got = layout.quantize_matmul_nbits_columns(
            source.column_reader(),
            source.k,
            source.n,
            numpy_dtype,
            32,
            symmetric=False,
            chunk_elements=700,  # several chunks per weight, not aligned with anything
        )
        for name in ("packed", "scales", "zero_points"):
            np.testing.assert_array_equal(
                getattr(got, name), getattr(expected, name), err_msg=f"{source.name}.{name}"
            )


def test_rows_are_read_in_blocks_only_where_they_are_the_output_features(monkeypatch):
    """f32/f16 checkpoint matrices use stored row blocks; bf16 (quantized through f32) and
    other tensors are read whole once."""
    calls: list[tuple[str, int, int]] = []
    original = CheckpointTensor.stored_rows

    def recording(self, start, stop, *, transpose=False):
        calls.append((self.name, start, stop))
        return original(self, start, stop, transpose=transpose)

    monkeypatch.setattr(CheckpointTensor, "stored_rows", recording)
    for dtype, blocked in (("f32", True), ("bf16", False)):
        calls.clear()
        source = next(s for s in _sources(dtype) if s.stored_nk)  # embedding, 384 rows
        read = source.column_reader()
        chunk = read(100, 200, np.dtype(np.float32))
        assert chunk.shape == (source.k, 100) and chunk.flags.c_contiguous
        np.testing.assert_array_equal(chunk, source.read()[:, 100:200].astype(np.float32))
        assert (calls == [(source.name, 100, 200)]) is blocked


def test_packed_projections_read_each_part_by_stored_rows(monkeypatch):
    calls: list[str] = []
    original = CheckpointTensor.stored_rows

    def recording(self, start, stop, *, transpose=False):
        calls.append(self.name)
        return original(self, start, stop, transpose=transpose)

    monkeypatch.setattr(CheckpointTensor, "stored_rows", recording)
    source = next(s for s in _sources("f32") if isinstance(s.values[0].const_value, ConcatTensor))
    columns = source.column_reader()(0, source.n, np.dtype(np.float32))
    np.testing.assert_array_equal(columns, source.read())
    assert [name.rsplit(".", 2)[-2] for name in calls] == ["q_proj", "k_proj", "v_proj"]
