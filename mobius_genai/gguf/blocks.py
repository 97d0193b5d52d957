"""GGUF block types as MatMulNBits blocks of 32: the integers and scales as llama.cpp stores them.

Each function takes the raw bytes of a matrix, [N, row bytes] (one row per output feature),
and returns `StoredBlocks` with ``w = (q - zero) * scale`` per block of 32 input features
(ggml-quants.c's dequantize_row_* in that form):

- Q4_0 (18 bytes / 32): fp16 d, 16 bytes of nibbles (element j low, j + 16 high);
  w = d * (q - 8): zero 8, MatMulNBits' implicit one.
- Q4_1 (20 bytes / 32): fp16 d, fp16 m, nibbles as Q4_0; w = d * q + m: zero -m / d (float).
- Q4_K (144 bytes / 256): fp16 d, fp16 dmin, 12 bytes of 6-bit sub-block scales and mins, 128
  bytes of nibbles (64 elements per 32 bytes: low nibbles first, then high); sub-block j:
  w = d * sc_j * q - dmin * m_j: scale d * sc_j, zero dmin * m_j / (d * sc_j) (float).
- Q8_0 (34 bytes / 32): fp16 d, 32 int8; w = d * q: q + 128 with zero 128 (8-bit, implicit).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mobius_genai.prequantized.tensor import StoredBlocks

__all__ = ["ACCEPTED_TYPES", "BLOCK", "DEQUANTIZED_TYPES", "NBITS_TYPES"]

BLOCK = 32


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes → [..., 32] values: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _float_zeros(offset: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """-offset / scale, 0 where the scale is 0 (the block is then all `offset`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale == 0, 0.0, -offset / scale).astype(np.float32)


def q4_0(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // BLOCK, 18)
    values = _nibbles(blocks[..., 2:]).reshape(n, k)
    return StoredBlocks(values, _f16(blocks[..., :2]), np.full((n, k // BLOCK), 8, np.int16))


def q4_1(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // BLOCK, 20)
    d, m = _f16(blocks[..., :2]), _f16(blocks[..., 2:4])
    return StoredBlocks(_nibbles(blocks[..., 4:]).reshape(n, k), d, _float_zeros(m, d))


def q8_0(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // BLOCK, 34)
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int16) + 128
    zeros = np.full((n, k // BLOCK), 128, np.int16)
    return StoredBlocks(q.astype(np.uint8).reshape(n, k), _f16(blocks[..., :2]), zeros)


def _k4_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., 12] bytes → the 8 sub-block scales and mins, 6 bits each (get_scale_min_k4)."""
    q = packed.astype(np.uint8)
    low, mid, high = q[..., 0:4], q[..., 4:8], q[..., 8:12]
    scales = np.concatenate([low & 63, (high & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([mid & 63, (high >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def q4_k(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // 256, 144)
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    sc, mins = _k4_scales(blocks[..., 4:16])
    qs = blocks[..., 16:].reshape(n, k // 256, 4, 32)
    values = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)  # chunk c: 2c low, 2c+1 high
    scale = (d[..., None] * sc).reshape(n, k // BLOCK)
    offset = -(dmin[..., None] * mins).reshape(n, k // BLOCK)
    return StoredBlocks(values, scale, _float_zeros(offset, scale))


#: GGUF type name → (bits, reader of its blocks).
NBITS_TYPES: dict[str, tuple[int, Callable[[np.ndarray, int, int], StoredBlocks]]] = {
    "Q4_0": (4, q4_0),
    "Q4_1": (4, q4_1),
    "Q4_K": (4, q4_k),
    "Q8_0": (8, q8_0),
}

#: GGUF types read as float through the gguf package's own `quants.dequantize` (exact): the
#: float types and the block types MatMulNBits cannot hold as they are.
DEQUANTIZED_TYPES = frozenset(
    {"F32", "F16", "BF16", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}
)
ACCEPTED_TYPES = DEQUANTIZED_TYPES | NBITS_TYPES.keys()
