"""runtime/audio_length.py: the rate and length of WAV, FLAC and MP3 files from their headers,
against libsndfile's (soundfile.info) for WAV and FLAC and the encoded signal's for MP3."""

from __future__ import annotations

import pytest
import soundfile

from mobius_genai.runtime.audio_length import audio_length
from tests.models.whisper._whisper import tone, write_encoded, write_wav


@pytest.mark.parametrize(("rate", "seconds"), [(16_000, 2.5), (44_100, 1.25), (8_000, 31.0)])
@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_wav_and_flac_lengths_equal_libsndfile(tmp_path, suffix, rate, seconds):
    path = tmp_path / f"a{suffix}"
    signal = tone(seconds, rate=rate)
    _ = write_wav(path, signal, rate) if suffix == ".wav" else write_encoded(path, signal, rate)
    info = soundfile.info(str(path))
    found = audio_length(path.read_bytes())
    assert found is not None and found.rate == info.samplerate == rate
    assert found.seconds == info.frames / info.samplerate and found.slack == 0


def test_float_wav_is_read_too(tmp_path):
    path = tmp_path / "float.wav"
    soundfile.write(path, tone(1.5), 16_000, subtype="FLOAT")
    assert audio_length(path.read_bytes()).seconds == 1.5


@pytest.mark.parametrize(("rate", "seconds"), [(16_000, 3.0), (44_100, 31.0), (8_000, 2.0)])
def test_mp3_length_counts_its_frames(tmp_path, rate, seconds):
    path = write_encoded(tmp_path / "a.mp3", tone(seconds, rate=rate), rate)
    path.write_bytes(b"ID3\x03\x00\x00\x00\x00\x00\x05" + b"\x00" * 5 + path.read_bytes())
    found = audio_length(path.read_bytes())
    assert found is not None and found.rate == rate
    assert seconds <= found.seconds <= seconds + found.slack + 0.05  # a frame or two of padding


@pytest.mark.parametrize(
    "content", [b"", b"RIFF\x00\x00\x00\x00WAVE", b"fLaC" + bytes(30), b"\xff\xfb" + bytes(40)]
)
def test_headers_that_say_nothing_give_none(tmp_path, content):
    path = tmp_path / "x.bin"
    path.write_bytes(content)
    assert audio_length(path.read_bytes()) is None


def test_mp3_frames_after_other_bytes_are_counted_and_a_tail_is_not(tmp_path):
    """og's decoder skips bytes between frames and reads the frames after them: a file of two
    encodings with bytes between is as long as both; padding and a tag after the last frame
    add nothing."""
    one = write_encoded(tmp_path / "a.mp3", tone(3.0)).read_bytes()
    alone = audio_length(one).seconds
    tail = b"TAG" + bytes(125) + bytes(300)
    assert audio_length(one + tail).seconds == alone
    assert audio_length(one + b"\x12\x34" * 50 + one + tail).seconds == 2 * alone
