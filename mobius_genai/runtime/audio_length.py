"""The sample rate and length of an audio file onnxruntime-genai's decoder takes (WAV, FLAC,
MP3), read from the file's headers and frames without decoding it.

og's processor cuts audio to the encoder's window without a word, so `run --audio` and `bench
--audio` check a file's length first; og 0.18's decoder (onnxruntime-extensions' AudioDecoder)
reads these three formats and refuses others ("Cannot detect audio stream format").
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class AudioLength:
    rate: int  # samples per second, as stored
    seconds: float
    slack: float = 0.0  # seconds `seconds` may count beyond the audio (an encoder's padding)


def audio_length(data: bytes) -> AudioLength | None:
    """The rate and length of an audio file's bytes; None where its headers do not say
    (another format, a FLAC stream of unknown length, a damaged file: og's decoder says what it
    makes of it)."""
    for reader in (_wav, _flac, _mp3):
        found = reader(data)
        if found is not None:
            return found
    return None


def _wav(data: bytes) -> AudioLength | None:
    """RIFF/WAVE: the `fmt ` chunk's rate and block size, the `data` chunk's size (any
    sample format, PCM or float)."""
    fmt, samples = wav_chunks(data)
    if fmt is None or len(fmt) < 24 or samples is None:
        return None
    rate = int.from_bytes(fmt[12:16], "little")
    block = int.from_bytes(fmt[20:22], "little")
    if not rate or not block:
        return None
    return AudioLength(rate, len(samples) // block / rate)


def wav_chunks(data: bytes) -> tuple[bytes | None, bytes | None]:
    """A RIFF/WAVE file's `fmt ` chunk (its 8-byte header included) and its `data` chunk's
    bytes (as far as the file holds them), each None where the file lacks it; (None, None)
    for another format."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None, None
    fmt = samples = None
    at = 12
    while at + 8 <= len(data):
        name, length = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        if name == b"fmt ":
            fmt = data[at : at + 8 + length]
        elif name == b"data":
            samples = data[at + 8 : at + 8 + length]
            break
        at += 8 + length + length % 2
    return fmt, samples


def skip_id3(data: bytes) -> int:
    """Where the audio starts after an ID3v2 tag (its size is four 7-bit bytes)."""
    if data[:3] != b"ID3" or len(data) < 10:
        return 0
    size = 0
    for byte in data[6:10]:
        size = size << 7 | (byte & 0x7F)
    return 10 + size + (10 if data[5] & 0x10 else 0)


def _flac(data: bytes) -> AudioLength | None:
    """FLAC: STREAMINFO, the first metadata block, holds the rate (20 bits) and the number of
    samples per channel (36 bits; 0 when the encoder did not know it)."""
    at = skip_id3(data)
    if data[at : at + 4] != b"fLaC" or len(data) < at + 26 or data[at + 4] & 0x7F != 0:
        return None
    fields = int.from_bytes(data[at + 18 : at + 26], "big")
    rate, samples = fields >> 44, fields & (1 << 36) - 1
    return AudioLength(rate, samples / rate) if rate and samples else None


#: MPEG audio layer III: kbit/s by bitrate index, for MPEG-1 and for MPEG-2 / 2.5.
_KBPS = {
    1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
#: Sample rates by the version bits (0: MPEG-2.5, 2: MPEG-2, 3: MPEG-1) and the rate index.
_RATES = {0: (11_025, 12_000, 8_000), 2: (22_050, 24_000, 16_000), 3: (44_100, 48_000, 32_000)}


def mp3_frame(header: int) -> tuple[int, int, int] | None:
    """(rate, samples, bytes) of the MPEG layer III frame whose 4-byte header is `header`."""
    version, layer = header >> 19 & 3, header >> 17 & 3
    bitrate, rate_index, padding = header >> 12 & 15, header >> 10 & 3, header >> 9 & 1
    if header >> 21 != 0x7FF or version == 1 or layer != 1 or bitrate in (0, 15):
        return None
    if rate_index == 3:
        return None
    rate = _RATES[version][rate_index]
    samples = 1152 if version == 3 else 576
    kbps = _KBPS[1 if version == 3 else 2][bitrate]
    return rate, samples, samples // 8 * kbps * 1000 // rate + padding


def _mp3(data: bytes) -> AudioLength | None:
    """MP3: the frames counted from the first header on (constant or variable bitrate), and on
    past other bytes where frames start again (og's decoder skips them); up to two frames longer
    than the audio (an encoder's Info frame, its delay and padding)."""
    at, rate, samples, count = skip_id3(data), 0, 0, 0
    while at + 4 <= len(data):
        frame = mp3_frame(int.from_bytes(data[at : at + 4], "big"))
        if frame is None:
            resumed = mp3_resumes(data, at, (rate, count)) if samples else None
            if resumed is None:
                break
            at = resumed
            continue
        rate, count, size = frame
        samples, at = samples + count, at + size
    return AudioLength(rate, samples / rate, slack=2 * count / rate) if samples else None


def mp3_resumes(data: bytes, at: int, shape: tuple[int, int]) -> int | None:
    """Where layer III frames of `shape` (rate, samples per frame) start again after `at`: a
    frame followed by another of that shape; None where none does (a tag, padding)."""
    sync = data.find(b"\xff", at)
    while 0 <= sync < len(data) - 4:
        frame = mp3_frame(int.from_bytes(data[sync : sync + 4], "big"))
        if frame is not None and frame[:2] == shape:
            after = data[sync + frame[2] : sync + frame[2] + 4]
            following = mp3_frame(int.from_bytes(after, "big")) if len(after) == 4 else None
            if following is not None and following[:2] == shape:
                return sync
        sync = data.find(b"\xff", sync + 1)
    return None
