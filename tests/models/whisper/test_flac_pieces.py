"""A long FLAC cut into pieces of whole frames (`runtime/flac_pieces.py`) without decoding it:
onnxruntime-genai's processor reads each piece as the same samples written as a WAV file (so
the pieces hold the file's audio, in order, nothing lost or added), and `run --audio` of a
long FLAC prints the transcript of its joined log-mels."""

from __future__ import annotations

import io

import numpy as np
import onnxruntime_genai as og
import pytest
import soundfile

from mobius_genai.cli import main
from mobius_genai.runtime.audio import Clip, tone_bytes
from mobius_genai.runtime.flac_pieces import flac_pieces
from mobius_genai.runtime.opening import open_bundle
from mobius_genai.runtime.transcription import clip_features
from tests.models.whisper._whisper import write_encoded

RATE = 16_000
WINDOW = 30 * RATE


def _signal(seconds: float) -> np.ndarray:
    """A tone under noise (the noise makes the FLAC frames' bytes look random)."""
    time = np.arange(round(seconds * RATE)) / RATE
    noise = np.random.default_rng(0).standard_normal(time.size)
    return (0.3 * np.sin(2 * np.pi * 300 * time) + 0.05 * noise).astype(np.float32)


def _id3(data: bytes) -> bytes:
    """`data` after an ID3v2 tag (a title), as taggers write it before a FLAC stream."""
    title = b"\x03lecture"
    frame = b"TIT2" + len(title).to_bytes(4, "big") + b"\x00\x00" + title
    size = len(frame)
    syncsafe = bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))
    return b"ID3\x04\x00\x00" + syncsafe + frame + data


@pytest.mark.parametrize("tagged", [False, True])
def test_each_piece_is_read_as_the_same_samples_in_a_wav(speech_bundle, tmp_path, tagged):
    signal = _signal(75.0)
    data = write_encoded(tmp_path / "long.flac", signal).read_bytes()
    samples = soundfile.read(io.BytesIO(data), dtype="int16")[0]
    pieces = flac_pieces(_id3(data) if tagged else data, WINDOW)
    assert pieces is not None and len(pieces) == 3
    assert all(0 < piece.samples <= WINDOW for piece in pieces)
    assert sum(piece.samples for piece in pieces) == samples.size
    processor = og.Model(str(speech_bundle)).create_multimodal_processor()

    def mel(audio: bytes) -> np.ndarray:
        inputs = processor("<|startoftranscript|>", audios=og.Audios.open_bytes(audio))
        return inputs["audio_features"].as_numpy()

    start = 0
    for piece in pieces:
        wav = io.BytesIO()
        soundfile.write(wav, samples[start : start + piece.samples], RATE, format="WAV")
        np.testing.assert_array_equal(mel(piece.data), mel(wav.getvalue()))
        start += piece.samples


def test_a_long_flac_missing_a_frame_is_one_clear_line(speech_bundle, tmp_path, capsys):
    data = write_encoded(tmp_path / "whole.flac", _signal(45.0)).read_bytes()
    pieces = flac_pieces(data, WINDOW)
    middle = len(data) // 2
    damaged = tmp_path / "damaged.flac"
    damaged.write_bytes(data[:middle] + data[middle + 4000 :])  # a frame's bytes or more gone
    assert sum(p.samples for p in flac_pieces(damaged.read_bytes(), WINDOW)) < sum(
        p.samples for p in pieces
    )
    code = main(["run", str(speech_bundle), "--audio", str(damaged)])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == "" and "Traceback" not in captured.err
    assert "damaged.flac: a damaged FLAC file (its frames hold" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_other_bytes_are_no_flac_pieces():
    assert flac_pieces(tone_bytes(1.0), WINDOW) is None
    assert flac_pieces(b"fLaC" + bytes(50), WINDOW) is None
    assert flac_pieces(b"not audio", WINDOW) is None


def test_a_long_flac_joins_its_pieces_log_mels(speech_bundle, tmp_path, capsys):
    """The log-mel of each piece up to where its audio ends, the last one whole, on one scale;
    `run --audio` transcribes it (over 30 s: refused before)."""
    path = write_encoded(tmp_path / "long.flac", _signal(45.0))
    bundle = open_bundle(speech_bundle, command="run")
    mel, seconds = clip_features(bundle, Clip.read(path))
    pieces = flac_pieces(path.read_bytes(), WINDOW)
    first = pieces[0].samples * 100 // RATE
    assert seconds == 45.0 and mel.shape[-1] == first + 3000
    wav = io.BytesIO()
    soundfile.write(
        wav,
        soundfile.read(path, dtype="int16")[0][pieces[0].samples :],
        RATE,
        "PCM_16",
        format="WAV",
    )
    processor = og.Model(str(speech_bundle)).create_multimodal_processor()
    rest = processor("<|startoftranscript|>", audios=og.Audios.open_bytes(wav.getvalue()))
    rest = rest["audio_features"].as_numpy()
    # the same log-mel, on the whole clip's scale (clip_features: one floor, 8 below the
    # largest of both pieces): one offset wherever neither floor bites
    live = (mel[..., first:] > mel.min() + 1e-6) & (rest > rest.min() + 1e-6)
    assert live.mean() > 0.5 and np.ptp((mel[..., first:] - rest)[live]) < 1e-5
    code = main(["run", str(speech_bundle), "--audio", str(path), "--max-new-tokens", "3"])
    out = capsys.readouterr().out
    assert code == 0 and out.strip()
