"""A FLAC file cut into pieces of whole frames, without decoding it: each FLAC frame is decoded
on its own (its header, subframes and CRC), so a piece is the STREAMINFO block (its sample count
set to the piece's, its MD5 cleared, the last metadata block) and a run of the frames.

onnxruntime-genai's processor decodes a file whole and cuts its log-mel at the encoder's
window, so a long FLAC is given to it a piece at a time (`runtime/transcription.py`). A frame's
header is told from audio bytes by its sync code, its CRC-8 and its number: the frame (fixed
blocking) or first sample (variable blocking) that must come next.
"""

from __future__ import annotations

import dataclasses

from mobius_genai.runtime.audio_length import skip_id3

#: Samples per frame by the header's block-size code (6 and 7: read after the number).
_BLOCK_SIZES = {1: 192, **{code: 576 << code - 2 for code in range(2, 6)}}
_BLOCK_SIZES.update({code: 256 << code - 8 for code in range(8, 16)})


@dataclasses.dataclass(frozen=True)
class FlacPiece:
    data: bytes
    samples: int
    """Samples per channel in the piece."""


def flac_pieces(data: bytes, samples: int) -> list[FlacPiece] | None:
    """The FLAC file `data` in pieces of whole frames, each at most `samples` long (a frame
    longer than that alone); None when `data` is no FLAC file whose frames can be read."""
    start = skip_id3(data)
    if data[start : start + 4] != b"fLaC":
        return None
    streaminfo, frames_at = _metadata(data, start + 4)
    if streaminfo is None:
        return None
    frames = _frames(data, frames_at)
    if not frames:
        return None
    pieces, first, length = [], 0, 0
    for i, (_, count) in enumerate(frames):
        if length and length + count > samples:
            pieces.append(_piece(data, streaminfo, frames, first, i, length))
            first, length = i, 0
        length += count
    pieces.append(_piece(data, streaminfo, frames, first, len(frames), length))
    return pieces


def _metadata(data: bytes, at: int) -> tuple[bytes | None, int]:
    """STREAMINFO's 34 bytes and where the frames start (after the last metadata block)."""
    streaminfo = None
    while at + 4 <= len(data):
        kind, length = data[at], int.from_bytes(data[at + 1 : at + 4], "big")
        if kind & 0x7F == 0 and length == 34:
            streaminfo = data[at + 4 : at + 38]
        at += 4 + length
        if kind & 0x80:
            return streaminfo, at
    return None, at


def _piece(
    data: bytes, streaminfo: bytes, frames: list[tuple[int, int]], first: int, end: int, length: int
) -> FlacPiece:
    """The file of frames `first` to `end` (exclusive): STREAMINFO with `length` samples."""
    stop = frames[end][0] if end < len(frames) else len(data)
    fields = int.from_bytes(streaminfo[10:18], "big") & ~((1 << 36) - 1) | length
    info = streaminfo[:10] + fields.to_bytes(8, "big") + bytes(16)
    header = b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big")
    return FlacPiece(header + info + data[frames[first][0] : stop], length)


def _frames(data: bytes, at: int) -> list[tuple[int, int]]:
    """(offset, samples) of each frame from `at` on, each found at the number expected next."""
    found: list[tuple[int, int]] = []
    number = 0
    while True:
        at = data.find(b"\xff", at)
        if at < 0 or at + 1 >= len(data):
            return found
        header = _frame_header(data, at)
        if header is None or header[0] != number:
            at += 1
            continue
        variable, count = header[1], header[2]
        found.append((at, count))
        number = (number + count) if variable else len(found)
        at += 1


def _frame_header(data: bytes, at: int) -> tuple[int, bool, int] | None:
    """(number, variable blocking, samples) of a valid frame header at `at`, else None."""
    if data[at + 1] & 0xFE != 0xF8 or at + 6 > len(data):
        return None
    size_code, rate_code = data[at + 2] >> 4, data[at + 2] & 15
    if size_code == 0 or rate_code == 15 or data[at + 3] & 1 or data[at + 3] >> 4 > 10:
        return None
    number, end = _utf8_number(data, at + 4)
    if number is None:
        return None
    count = _BLOCK_SIZES.get(size_code)
    if size_code in (6, 7):
        width = size_code - 5
        count = int.from_bytes(data[end : end + width], "big") + 1
        end += width
    end += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if end >= len(data) or _crc8(data[at:end]) != data[end]:
        return None
    return number, bool(data[at + 1] & 1), count


def _utf8_number(data: bytes, at: int) -> tuple[int | None, int]:
    """The frame or sample number coded as UTF-8 (up to 7 bytes) and where it ends."""
    first = data[at]
    extra = next((n for n in range(7) if not first & 0x80 >> n), 7)
    if extra == 1 or at + max(extra, 1) > len(data):
        return None, at
    value = first & (0x7F >> extra)
    for byte in data[at + 1 : at + max(extra, 1)]:
        if byte & 0xC0 != 0x80:
            return None, at
        value = value << 6 | byte & 0x3F
    return value, at + max(extra, 1)


def _crc8(data: bytes) -> int:
    """FLAC's header CRC-8 (polynomial x^8 + x^2 + x + 1)."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc << 1 ^ 0x07 if crc & 0x80 else crc << 1) & 0xFF
    return crc
