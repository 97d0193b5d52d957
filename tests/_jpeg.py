"""JPEG files written here (tests install no image library): baseline, 8-bit, three components,
an image of flat 8 x 8 blocks, each block's colour carried by its DC coefficient alone."""

from __future__ import annotations

import numpy as np

_SOI, _EOI = b"\xff\xd8", b"\xff\xd9"
#: DC categories 0..11, each a 4-bit code; AC: the end-of-block symbol alone, code "0".
_DC_COUNTS = bytes([0, 0, 0, 12] + [0] * 12)
_AC_COUNTS = bytes([1] + [0] * 15)


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def _ycbcr(rgb: np.ndarray) -> np.ndarray:
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    y = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    return np.clip(np.rint(np.stack([y, cb, cr], -1)), 0, 255).astype(int)


def jpeg_bytes(blocks: np.ndarray) -> bytes:
    """A JPEG of `blocks` (uint8 RGB [rows, columns, 3]), each pixel of it an 8 x 8 block."""
    rows, columns, _ = blocks.shape
    frame = bytes([8]) + (rows * 8).to_bytes(2, "big") + (columns * 8).to_bytes(2, "big")
    frame += bytes([3, 1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0])
    header = _SOI + _segment(0xDB, bytes([0]) + bytes([1] * 64)) + _segment(0xC0, frame)
    header += _segment(0xC4, bytes([0x00]) + _DC_COUNTS + bytes(range(12)))
    header += _segment(0xC4, bytes([0x10]) + _AC_COUNTS + bytes([0]))
    header += _segment(0xDA, bytes([3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0]))
    return header + _entropy(_ycbcr(blocks)) + _EOI


def _entropy(levels: np.ndarray) -> bytes:
    """The scan: per block, per component, the DC difference and an end of block."""
    bits, previous = [], [0, 0, 0]
    for row in levels:
        for block in row:
            for component, level in enumerate(block):
                dc = 8 * (int(level) - 128)  # a flat block's DC with quantization 1
                diff, previous[component] = dc - previous[component], dc
                category = abs(diff).bit_length()
                bits.append(format(category, "04b"))
                if category:
                    value = diff if diff > 0 else diff + (1 << category) - 1
                    bits.append(format(value, f"0{category}b"))
                bits.append("0")  # end of block
    stream = "".join(bits)
    stream += "1" * (-len(stream) % 8)
    data = int(stream, 2).to_bytes(len(stream) // 8, "big")
    return data.replace(b"\xff", b"\xff\x00")
