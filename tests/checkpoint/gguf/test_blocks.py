"""GGUF block types read as MatMulNBits blocks equal the gguf package's own dequantization."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mobius_genai.checkpoint.gguf.blocks import NBITS_TYPES
from tests.checkpoint.gguf._tiny import random_blocks


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_blocks_dequantize_like_gguf(kind):
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(8, 256)).astype(np.float32)
    qtype = GGMLQuantizationType[kind]
    raw = quantize(weight, qtype)
    block_type = NBITS_TYPES[kind]
    stored = block_type.read(raw, 8, 256)
    ours = stored.dequantize(block_type.block_size)
    np.testing.assert_allclose(ours, dequantize(raw, qtype), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K"])
def test_k_quant_blocks_dequantize_like_gguf(kind):
    """The k-quants have no numpy quantizer in gguf: random bytes with finite fp16 d and dmin."""
    raw = random_blocks(kind, 4, 512, np.random.default_rng(1))
    stored = NBITS_TYPES[kind].read(raw, 4, 512)
    expected = dequantize(raw, GGMLQuantizationType[kind])
    np.testing.assert_allclose(stored.dequantize(32), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["Q5_1", "Q5_K"])
def test_5_bit_blocks_with_offsets_keep_their_integers(kind):
    """Q5_1 and Q5_K as 8-bit MatMulNBits in blocks of 32: the 5-bit integers as stored (the
    nibble and the high bit gguf reads), the scale d (Q5_1) or d * sc_j (Q5_K), and float zero
    points, -m / d or dmin * m_j / (d * sc_j), which the packager splits into integer zero
    points and block mins (tests/checkpoint/gguf/test_q5.py)."""
    rng = np.random.default_rng(4)
    if kind == "Q5_1":
        raw = quantize(rng.normal(size=(6, 512)).astype(np.float32), GGMLQuantizationType.Q5_1)
    else:
        raw = random_blocks(kind, 6, 512, rng)
    block_type = NBITS_TYPES[kind]
    assert (block_type.bits, block_type.block_size, block_type.zero_form) == (8, 32, "float")
    stored = block_type.read(raw, 6, 512)
    assert stored.values.dtype == np.uint8 and stored.values.max() == 31
    assert stored.scales.shape == stored.zeros.shape == (6, 512 // 32)
    expected = dequantize(raw, GGMLQuantizationType[kind]).reshape(6, 16, 32)
    q = stored.values.reshape(6, 16, 32).astype(np.float32)
    scales, zeros = stored.scales[..., None], stored.zeros[..., None]
    np.testing.assert_allclose((q - zeros) * scales, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("kind", "zero", "block_size"), [("Q5_0", 16, 32), ("Q6_K", 32, 16)])
def test_8_bit_blocks_keep_llama_cpp_integers(kind, zero, block_size):
    """Q5_0 and Q6_K as 8-bit MatMulNBits: the 5- and 6-bit integers, zero points 16 and 32
    (uint8) and the scales ggml defines; dequantized they are gguf's values bit for bit."""
    rng = np.random.default_rng(2)
    raw = random_blocks(kind, 6, 512, rng)
    block_type = NBITS_TYPES[kind]
    assert (block_type.bits, block_type.block_size) == (8, block_size)
    assert block_type.zero_form == "uint8"
    stored = block_type.read(raw, 6, 512)
    assert stored.values.dtype == np.uint8 and stored.values.max() < 2 * zero
    np.testing.assert_array_equal(stored.zeros, np.full((6, 512 // block_size), zero))
    expected = dequantize(raw, GGMLQuantizationType[kind])
    np.testing.assert_array_equal(stored.dequantize(block_size), expected)


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K", "Q5_1", "Q5_K"])
def test_a_zero_scale_keeps_the_block_offset(kind):
    """A block whose scale is 0 is all its offset (d*q + m with d = 0): MatMulNBits must give
    m there, not 0 (its integers are then free: they are set to 0 with zero point -1)."""
    rng = np.random.default_rng(3)
    qtype = GGMLQuantizationType[kind]
    if kind in ("Q4_1", "Q5_1"):
        raw = quantize(rng.normal(size=(4, 256)).astype(np.float32), qtype)
        raw.reshape(4, 8, -1)[:, 3, 0:2] = 0  # d of one block per row: +0.0
    else:
        raw = random_blocks(kind, 4, 512, rng)
        raw.reshape(4, 2, -1)[:, 1, 4] &= 0xC0  # sub-block 0's 6-bit scale of block 1: 0
    expected = dequantize(raw, GGMLQuantizationType[kind])
    block_type = NBITS_TYPES[kind]
    stored = block_type.read(raw, *expected.shape)
    np.testing.assert_allclose(
        stored.dequantize(block_type.block_size), expected, rtol=1e-5, atol=1e-6
    )
