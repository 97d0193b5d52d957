"""A long MP3 cut into pieces of whole frames (`runtime/mp3_pieces.py`) without decoding it:
each piece read by onnxruntime-genai's processor on its own, its lead-in dropped, the pieces'
log-mels join into the log-mel og gives for the whole file (cut on a 10 s window here, so the
whole file fits og's 30 s), for MPEG-1 (1152 samples a frame) and MPEG-2 (576) files; and
`run --audio` of a 60 s MP3 prints transformers' long-form segments of its joined log-mel."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
import pytest

from mobius_genai.runtime import transcription
from mobius_genai.runtime.audio import Clip
from mobius_genai.runtime.mp3_pieces import mp3_pieces
from mobius_genai.runtime.opening import open_bundle
from mobius_genai.runtime.transcription import clip_features

#: Sample rate -> LAME's bit rate (kbit/s): an MPEG-2 and an MPEG-1 layer III file. og
#: resamples 32 kHz to 16 kHz at input index 2i, exactly; at 44.1 kHz its index (i / factor in
#: float32) drifts with the position, so the whole file's later log-mel frames are not the
#: reference there (its own pieces, WAV or MP3, are nearer the audio).
RATES = {16_000: 64, 32_000: 128}


def _mp3(seconds: float, rate: int) -> bytes:
    """A chirp, its loudness swinging, and bursts of noise (log-mel frames unlike their
    neighbours, so a piece joined a frame off shows), LAME-encoded."""
    import lameenc

    time = np.arange(round(seconds * rate)) / rate
    noise = np.random.default_rng(0).standard_normal(time.size)
    signal = 0.3 * np.sin(2 * np.pi * (200 * time + 20 * time**2)) * (1 + np.sin(4.4 * time)) / 2
    signal += 0.05 * noise * (np.sin(2.3 * time) > 0)
    encoder = lameenc.Encoder()
    encoder.set_bit_rate(RATES[rate])
    encoder.set_in_sample_rate(rate)
    encoder.set_channels(1)
    pcm = (np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes()
    return bytes(encoder.encode(pcm) + encoder.flush())


@pytest.mark.parametrize("rate", sorted(RATES))
def test_the_pieces_log_mels_join_into_the_whole_files(speech_bundle, monkeypatch, rate):
    data = _mp3(28.0, rate)
    processor = og.Model(str(speech_bundle)).create_multimodal_processor()
    inputs = processor("<|startoftranscript|>", audios=og.Audios.open_bytes(data))
    whole = inputs["audio_features"].as_numpy()
    pieces = mp3_pieces(data, 10, 100)
    assert pieces is not None and len(pieces) >= 3
    assert pieces[0].lead == 0 and all(piece.lead > 0 for piece in pieces[1:])
    monkeypatch.setattr(transcription, "max_seconds", lambda folder: 10)
    joined, seconds = clip_features(open_bundle(speech_bundle, command="run"), Clip(data, "a.mp3"))
    audio = round(seconds * 100) - 10  # the whole file's last frames: its end, not a join
    assert joined.shape[-1] >= audio and seconds > 28
    difference = np.abs(joined[..., :audio] - whole[..., :audio]).max(axis=1)[0]
    assert difference.max() < 1e-3, np.nonzero(difference >= 1e-3)


def test_frames_after_other_bytes_are_not_cut_and_a_tail_is(tmp_path):
    """Pieces would have to carry the bytes og's decoder skips between frames (and its bit
    reservoir across them): such a long file is refused (None; `run`'s one line says so); a
    tag or padding after the last frame is left out."""
    one = _mp3(20.0, 16_000)
    assert mp3_pieces(one + one, 30, 100) is not None
    assert mp3_pieces(one + b"\x12\x34" * 50 + one, 30, 100) is None
    padded = mp3_pieces(one + one + b"TAG" + bytes(125), 30, 100)
    assert padded is not None and b"TAG" not in padded[-1].data
