"""onnxruntime-genai 0.18's audio path on our Whisper bundle: its processor, reading our
audio_processor_config.json, turns a WAV file of generated audio into the log-mel transformers'
WhisperFeatureExtractor computes (up to og's edge frames), and the prompt into the forced ids;
og's greedy tokens from those inputs equal transformers' generate() on the same features."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
import pytest
from transformers import WhisperFeatureExtractor

from tests._ort import og_greedy
from tests.models.whisper._whisper import (
    FORCED_PROMPT,
    hf_new_tokens,
    pcm16,
    tone,
    write_bundle,
    write_multilingual_tokenizer,
    write_wav,
)

PROMPT_TEXT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
NEW_TOKENS = 20
RATE = 16_000
HOP = 160


@pytest.fixture(scope="module")
def bundle(multilingual_checkpoint, tmp_path_factory):
    _, folder = multilingual_checkpoint
    dest = write_bundle(folder, tmp_path_factory.mktemp("whisper-bundle"))
    write_multilingual_tokenizer(dest)
    return dest


def _processed(bundle, wav) -> tuple[og.Model, og.NamedTensors]:
    model = og.Model(str(bundle))
    processor = model.create_multimodal_processor()
    return model, processor(PROMPT_TEXT, audios=og.Audios.open(str(wav)))


def test_processor_gives_transformers_log_mel_and_the_forced_ids(bundle, tmp_path):
    signal = tone(seconds=2.0)
    _, inputs = _processed(bundle, write_wav(tmp_path / "tone.wav", signal))
    mel = inputs["audio_features"].as_numpy()
    assert inputs["input_ids"].as_numpy().tolist() == [FORCED_PROMPT["multilingual"]]
    as_read = pcm16(signal).astype(np.float32) / 32768
    extractor = WhisperFeatureExtractor(feature_size=80)
    expected = extractor(as_read, sampling_rate=RATE, return_tensors="np").input_features
    assert mel.shape == expected.shape == (1, 80, 3000)
    # og's STFT differs on the first two frames and the two whose window crosses the end of
    # the signal (docs/whisper.md); every other frame agrees
    end = signal.size // HOP
    frames = np.setdiff1d(np.arange(3000), [0, 1, end, end + 1])
    assert np.abs(mel - expected)[:, :, frames].max() < 1e-4
    assert np.abs(mel - expected).max() > 1e-2  # the edge frames do differ: the check is live


def test_og_greedy_from_the_processor_equals_transformers(
    bundle, multilingual_checkpoint, tmp_path
):
    model_hf, _ = multilingual_checkpoint
    model, inputs = _processed(bundle, write_wav(tmp_path / "tone.wav", tone(seconds=3.0)))
    mel = inputs["audio_features"].as_numpy().copy()  # set_inputs takes the tensors
    ours = og_greedy(model, inputs, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    assert ours == hf_new_tokens(model_hf, mel, FORCED_PROMPT["multilingual"], NEW_TOKENS)
