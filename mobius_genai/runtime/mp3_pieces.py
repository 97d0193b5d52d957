"""An MP3 file cut into pieces of whole frames, without decoding it, each decoded by og's
decoder (onnxruntime-extensions' dr_mp3, minimp3's decoder) into the samples the whole file
gives there.

onnxruntime-genai's processor decodes a file whole and cuts its log-mel at the encoder's
window, so a long MP3 is given to it a piece at a time (`runtime/transcription.py`). Unlike a
FLAC frame, a layer III frame does not decode on its own: its audio data may begin in the
frames before it (the bit reservoir: `main_data_begin` bytes back), and its first granule
overlaps the previous frame's last. minimp3 gives no samples for a frame whose reservoir lacks
those bytes and keeps the frame's data for the next. So each piece starts a few frames early:
frames the decoder skips, then at least `LEAD` frames it decodes whose log-mel is dropped (the
overlap and the filter bank settle in them), then the piece's own frames and `TAIL` more (the
log-mel's window reaches past the last own sample). The first decoded frame is found by
replaying minimp3's reservoir rule on the frames' side info, and is chosen where the log-mel's
10 ms grid meets a frame start, so the pieces' log-mels join on the whole file's grid. An
encoder's Info/Xing frame is a frame of silence to dr_mp3 (it applies no LAME delay), as here.
"""

from __future__ import annotations

import dataclasses
import math

from mobius_genai.runtime.audio_length import mp3_frame, mp3_resumes, skip_id3

#: Decoded frames before a piece's own audio, their log-mel dropped, and frames after it.
LEAD = 2
TAIL = 2
#: minimp3's bit reservoir holds at most this many bytes (MAX_BITRESERVOIR_BYTES).
_RESERVOIR = 511


@dataclasses.dataclass(frozen=True)
class Mp3Piece:
    data: bytes
    lead: int
    """Log-mel frames the piece's decoding gives before its own audio (to drop)."""
    frames: int
    """Log-mel frames of its own audio (the last piece: to its end, padding included)."""


@dataclasses.dataclass(frozen=True)
class _Frame:
    at: int
    size: int
    data_begin: int
    """main_data_begin: bytes of this frame's audio data in the frames before it."""
    data_bytes: int
    """Bytes of audio data it holds (after its header, CRC and side info)."""


def mp3_pieces(data: bytes, seconds: int, frames_per_second: int) -> list[Mp3Piece] | None:
    """The MP3 file `data` in pieces of whole frames of at most `seconds` each (lead-in and
    tail included), on a log-mel of `frames_per_second`; None when `data` is no MP3 file whose
    frames can all be read (bytes after the last frame other than a tag, a change of sample
    rate, frames again after other bytes), or whose frames are too small to hold a piece's
    lead-in."""
    frames, rate, samples = _frames(data)
    if len(frames) < 2:
        return None
    grid = rate // math.gcd(samples * frames_per_second, rate)  # frames between grid points
    per_window = seconds * rate // samples
    start = _decoded_from(frames, 0)  # minimp3 skips a first frame that leans on others too
    pieces, own = [], start
    while own < len(frames):
        first, decoded = _start(frames, own, grid)
        room = per_window - TAIL - (own - first)
        if room < grid:
            return None
        end = min(own + room // grid * grid, len(frames))
        stop = frames[min(end + TAIL, len(frames)) - 1]
        lead = round((own - decoded) * samples * frames_per_second / rate)
        count = round((end - own) * samples * frames_per_second / rate)
        pieces.append(Mp3Piece(data[frames[first].at : stop.at + stop.size], lead, count))
        own = end
    return pieces


def _start(frames: list[_Frame], own: int, grid: int) -> tuple[int, int]:
    """(first frame of the piece, first frame the decoder gives samples for) for a piece
    whose own audio starts at frame `own`: `LEAD` decoded frames or more before it, the first
    decoded one a whole number of grid steps before `own` where one is found near."""
    if own == _decoded_from(frames, 0):
        return 0, own
    fallback = None
    for first in range(own - LEAD, max(-1, own - LEAD - 2 * grid - 8), -1):
        decoded = _decoded_from(frames, first)
        if decoded > own - LEAD:
            continue
        if (own - decoded) % grid == 0:
            return first, decoded
        fallback = fallback or (first, decoded)
    return fallback or (0, _decoded_from(frames, 0))


def _decoded_from(frames: list[_Frame], first: int) -> int:
    """The first frame minimp3 gives samples for when decoding starts at frame `first`: one
    whose reservoir (the data of the frames read before it, up to 511 bytes) holds its
    main_data_begin."""
    reservoir = 0
    for index in range(first, len(frames)):
        if frames[index].data_begin <= reservoir:
            return index
        reservoir = min(reservoir + frames[index].data_bytes, _RESERVOIR)
    return len(frames)


def _frames(data: bytes) -> tuple[list[_Frame], int, int]:
    """The layer III frames from the first header on (after an ID3v2 tag), their sample rate
    and samples per frame; no frames for a file that changes either, or whose frames go on
    after other bytes (og's decoder would find them: audio these pieces would miss). Bytes
    after the last frame that hold no two frames in a row (a tag, padding) end the audio."""
    found: list[_Frame] = []
    at, shape = skip_id3(data), None
    while at + 6 <= len(data):
        header = int.from_bytes(data[at : at + 4], "big")
        frame = mp3_frame(header)
        if frame is None or at + frame[2] > len(data):
            break
        if shape is not None and frame[:2] != shape:
            return [], 0, 0
        shape = frame[:2]
        found.append(_side_info(data, at, header, frame[2]))
        at += frame[2]
    if shape is not None and mp3_resumes(data, at, shape) is not None:
        return [], 0, 0
    rate, samples = shape or (0, 0)
    return found, rate, samples


def _side_info(data: bytes, at: int, header: int, size: int) -> _Frame:
    """A frame's main_data_begin (9 bits in MPEG-1, 8 in MPEG-2 and 2.5) and data bytes."""
    mpeg1, mono = header >> 19 & 3 == 3, header >> 6 & 3 == 3
    side = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
    begin = at + 4 + (0 if header >> 16 & 1 else 2)  # a CRC after the header when bit 16 is 0
    word = int.from_bytes(data[begin : begin + 2], "big")
    return _Frame(at, size, word >> 7 if mpeg1 else word >> 8, size - (begin - at) - side)
