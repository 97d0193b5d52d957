"""GGUF block types read as MatMulNBits blocks equal the gguf package's own dequantization."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mobius_genai.gguf.blocks import BLOCK, NBITS_TYPES


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_blocks_dequantize_like_gguf(kind):
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(8, 256)).astype(np.float32)
    qtype = GGMLQuantizationType[kind]
    raw = quantize(weight, qtype)
    _, read = NBITS_TYPES[kind]
    stored = read(raw, 8, 256)
    ours = stored.dequantize(BLOCK)
    np.testing.assert_allclose(ours, dequantize(raw, qtype), rtol=0, atol=1e-6)


def test_q4_k_blocks_dequantize_like_gguf():
    """Q4_K has no numpy quantizer in gguf: random bytes with finite fp16 d and dmin."""
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(4, 2, 144), dtype=np.uint8)
    raw[..., 0:4] = np.frombuffer(
        rng.uniform(0.001, 0.01, size=(4, 2, 2)).astype(np.float16).tobytes(), np.uint8
    ).reshape(4, 2, 4)
    raw = raw.reshape(4, 288)
    stored = NBITS_TYPES["Q4_K"][1](raw, 4, 512)
    expected = dequantize(raw, GGMLQuantizationType.Q4_K)
    np.testing.assert_allclose(stored.dequantize(BLOCK), expected, rtol=1e-5, atol=1e-6)
