"""Large checkpoint tensors are read in row blocks and cast exactly (weights.py streaming)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai.checkpoint import weights
from tests.conftest import TINY_QWEN2


def test_bf16_widening_is_the_exact_cast():
    rng = np.random.default_rng(0)
    values = rng.standard_normal((37, 53)).astype(np.float32)
    values[0, :6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40]
    bf16 = values.astype(ml_dtypes.bfloat16)
    for transposed in (False, True):
        expected = (bf16.T if transposed else bf16).astype(np.float32)
        got = weights._cast(bf16, np.dtype(np.float32), transposed)
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def _initializers(monkeypatch: pytest.MonkeyPatch, stream_elements: int) -> dict[str, np.ndarray]:
    monkeypatch.setattr(weights, "STREAM_ELEMENTS", stream_elements)
    reads = []
    original = weights.Checkpoint.read
    monkeypatch.setattr(
        weights.Checkpoint,
        "read",
        lambda self, name, index=None: reads.append(index) or original(self, name, index),
    )
    built = mobius_genai.build(TINY_QWEN2, "cpu", "f32")
    values = {
        name: value.const_value.numpy()
        for name, value in built["model"].graph.initializers.items()
        if isinstance(value.const_value, ir.LazyTensor)
    }
    _initializers.reads = reads  # type: ignore[attr-defined]
    return values


def test_streamed_tensors_equal_whole_reads(monkeypatch: pytest.MonkeyPatch):
    whole = _initializers(monkeypatch, 1 << 40)
    assert all(index is None for index in _initializers.reads)  # type: ignore[attr-defined]
    streamed = _initializers(monkeypatch, 1000)  # every 2-D tensor of the tiny model streams
    blocks = [index for index in _initializers.reads if index is not None]  # type: ignore[attr-defined]
    assert len(blocks) > len(streamed)  # several row blocks per streamed tensor
    assert whole.keys() == streamed.keys()
    for name, array in whole.items():
        np.testing.assert_array_equal(streamed[name], array, err_msg=name)
