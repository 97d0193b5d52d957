"""GGUF block types as MatMulNBits blocks: the integers and scales as llama.cpp stores them.

Each function takes the raw bytes of a matrix, [N, row bytes] (one row per output feature),
and returns `StoredBlocks` with ``w = (q - zero) * scale`` per block of 32 input features (16
for Q6_K) (ggml-quants.c's dequantize_row_* in that form):

- Q4_0 (18 bytes / 32): fp16 d, 16 bytes of nibbles (element j low, j + 16 high);
  w = d * (q - 8): zero 8, MatMulNBits' implicit one.
- Q4_1 (20 bytes / 32): fp16 d, fp16 m, nibbles as Q4_0; w = d * q + m: zero -m / d (float;
  a block with d = 0 is all m: integers 0, scale m, zero -1).
- Q4_K (144 bytes / 256): fp16 d, fp16 dmin, 12 bytes of 6-bit sub-block scales and mins, 128
  bytes of nibbles (64 elements per 32 bytes: low nibbles first, then high); sub-block j:
  w = d * sc_j * q - dmin * m_j: scale d * sc_j, zero dmin * m_j / (d * sc_j) (float).
- Q8_0 (34 bytes / 32): fp16 d, 32 int8; w = d * q: q + 128 with zero 128 (8-bit, implicit).
- Q5_0 (22 bytes / 32): fp16 d, 4 bytes of high bits (bit j: element j), nibbles as Q4_0;
  w = d * (q - 16): 8-bit, uint8 zero 16.
- Q5_1 (24 bytes / 32): fp16 d, fp16 m, high bits and nibbles as Q5_0; w = d * q + m: 8-bit,
  zero -m / d (float) as Q4_1.
- Q5_K (176 bytes / 256): fp16 d, fp16 dmin, 12 bytes of scales and mins as Q4_K, 32 bytes of
  high bits (bit j of byte i: element i of sub-block j), 128 bytes of nibbles as Q4_K;
  w = d * sc_j * q - dmin * m_j: 8-bit, float zero dmin * m_j / (d * sc_j) as Q4_K.
- Q6_K (210 bytes / 256): 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 sub-block
  scales, fp16 d; per half of 128: element 64s + j low nibble of byte j (s = 0) or high (s =
  1), element 32t + j bits 2t of high byte j; sub-block of 16 j: w = d * sc_j * (q - 32):
  8-bit, block 16, uint8 zero 32.

Float zero points (Q4_1, Q4_K, Q5_1, Q5_K) are written as integer zero points plus block mins
(quantize/stored_weights.py), so the 8-bit ones need no float zero points in MatMulNBits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from mobius_genai.checkpoint.prequantized.tensor import StoredBlocks

__all__ = ["ACCEPTED_TYPES", "DEQUANTIZED_TYPES", "NBITS_TYPES", "BlockType"]

BLOCK = 32


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes → [..., 32] values: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _with_offset(values: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> StoredBlocks:
    """Blocks of ``w = scale * q + offset`` as ``(q - zero) * scale`` with float zero points
    -offset / scale. A block whose scale is 0 is all `offset`: its integers (unused by
    llama.cpp) become 0 with scale `offset` and zero point -1, which is exactly that."""
    n = values.shape[0]
    empty = scale == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        zeros = np.where(empty, -1.0, -offset / scale).astype(np.float32)
    blocks = values.reshape(n, scale.shape[1], -1)
    values = np.where(empty[..., None], 0, blocks).astype(np.uint8).reshape(n, -1)
    return StoredBlocks(values, np.where(empty, offset, scale).astype(np.float32), zeros)


def q4_0(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // BLOCK, 18)
    values = _nibbles(blocks[..., 2:]).reshape(n, k)
    return StoredBlocks(values, _f16(blocks[..., :2]), np.full((n, k // BLOCK), 8, np.int16))


def q4_1(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // BLOCK, 20)
    d, m = _f16(blocks[..., :2]), _f16(blocks[..., 2:4])
    return _with_offset(_nibbles(blocks[..., 4:]).reshape(n, k), d, m)


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


def _k_offsets(header: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, K/256, 16] bytes (fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins) → the scale
    d * sc_j and offset -dmin * m_j of each sub-block of 32, [n, K/32] each (Q4_K, Q5_K)."""
    n = header.shape[0]
    d, dmin = _f16(header[..., 0:2]), _f16(header[..., 2:4])
    sc, mins = _k4_scales(header[..., 4:16])
    return (d[..., None] * sc).reshape(n, -1), -(dmin[..., None] * mins).reshape(n, -1)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, K/256, 128] bytes → [n, K] values: 32 bytes per 64 elements, low nibbles first."""
    n = qs.shape[0]
    chunks = qs.reshape(n, -1, 4, 32)
    return np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(n, -1)  # chunk c: 2c, 2c+1


def q4_k(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // 256, 144)
    return _with_offset(_k_nibbles(blocks[..., 16:]), *_k_offsets(blocks[..., :16]))


def _high_bits(packed: np.ndarray) -> np.ndarray:
    """[..., b] bytes → [..., 8b] bits, bit j of byte i at 8i + j (4 bytes: a little-endian
    uint32's bits in order)."""
    return np.unpackbits(packed, axis=-1, bitorder="little")


def q5_0(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // BLOCK, 22)
    values = _nibbles(blocks[..., 6:]) | (_high_bits(blocks[..., 2:6]) << 4)
    zeros = np.full((n, k // BLOCK), 16, np.int16)
    return StoredBlocks(values.reshape(n, k), _f16(blocks[..., :2]), zeros)


def q5_1(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // BLOCK, 24)
    values = _nibbles(blocks[..., 8:]) | (_high_bits(blocks[..., 4:8]) << 4)
    return _with_offset(values.reshape(n, k), _f16(blocks[..., :2]), _f16(blocks[..., 2:4]))


def q5_k(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // 256, 176)
    high = _high_bits(blocks[..., 16:48, None]).swapaxes(-1, -2)  # [.., sub-block j, element i]
    values = _k_nibbles(blocks[..., 48:]) | (high.reshape(n, k) << 4)
    return _with_offset(values, *_k_offsets(blocks[..., :16]))


def q6_k(raw: np.ndarray, n: int, k: int) -> StoredBlocks:
    blocks = raw.reshape(n, k // 256, 210)
    low = blocks[..., :128].reshape(n, k // 256, 2, 1, 64)
    low = np.concatenate([low & 0x0F, low >> 4], axis=3)  # [.., half, s, 64]
    high = blocks[..., 128:192].reshape(n, k // 256, 2, 1, 32)
    high = np.concatenate([(high >> shift) & 3 for shift in (0, 2, 4, 6)], axis=3)
    values = (low.reshape(n, k) | (high.reshape(n, k) << 4)).astype(np.uint8)
    sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32)
    scale = (_f16(blocks[..., 208:210])[..., None] * sc).reshape(n, k // 16)
    return StoredBlocks(values, scale, np.full((n, k // 16), 32, np.int16))


@dataclasses.dataclass(frozen=True)
class BlockType:
    """How one GGUF block type becomes MatMulNBits: bits, block size, zero-point form (see
    `prequantized.tensor.ZERO_FORMS`) and the reader of its blocks."""

    bits: int
    block_size: int
    zero_form: str
    read: Callable[[np.ndarray, int, int], StoredBlocks]


#: GGUF type name → its MatMulNBits form.
NBITS_TYPES: dict[str, BlockType] = {
    "Q4_0": BlockType(4, BLOCK, "implicit", q4_0),
    "Q4_1": BlockType(4, BLOCK, "float", q4_1),
    "Q4_K": BlockType(4, BLOCK, "float", q4_k),
    "Q5_0": BlockType(8, BLOCK, "uint8", q5_0),
    "Q5_1": BlockType(8, BLOCK, "float", q5_1),
    "Q5_K": BlockType(8, BLOCK, "float", q5_k),
    "Q6_K": BlockType(8, 16, "uint8", q6_k),
    "Q8_0": BlockType(8, BLOCK, "implicit", q8_0),
}

#: GGUF types read as float through the gguf package's own `quants.dequantize` (exact): the
#: float types and the block types MatMulNBits cannot hold as they are.
DEQUANTIZED_TYPES = frozenset({"F32", "F16", "BF16", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"})
ACCEPTED_TYPES = DEQUANTIZED_TYPES | NBITS_TYPES.keys()
