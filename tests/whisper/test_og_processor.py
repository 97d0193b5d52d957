"""onnxruntime-genai 0.18's audio path on our Whisper bundle: its processor, reading our
audio_processor_config.json, turns a WAV file of generated audio into the log-mel transformers'
WhisperFeatureExtractor computes (up to og's edge frames), and the prompt into the forced ids;
og's greedy tokens from those inputs equal transformers' generate() on the same features."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
import pytest
import torch
from transformers import WhisperFeatureExtractor

from tests.whisper._whisper import (
    FORCED_PROMPT,
    pcm16,
    tone,
    write_bundle,
    write_multilingual_tokenizer,
    write_wav,
)

PROMPT_TEXT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
MAX_LENGTH = 24
RATE = 16_000
HOP = 160

pytestmark = pytest.mark.filterwarnings("ignore:GQA fusion expected:UserWarning")


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
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, do_sample=False)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    ours = [int(token) for token in generator.get_sequence(0)]
    prompt = FORCED_PROMPT["multilingual"]
    model_hf.generation_config.suppress_tokens = None  # og suppresses nothing
    model_hf.generation_config.begin_suppress_tokens = None
    with torch.no_grad():
        generated = model_hf.generate(
            input_features=torch.from_numpy(mel),
            decoder_input_ids=torch.tensor([prompt]),
            max_new_tokens=MAX_LENGTH - len(prompt),
            do_sample=False,
            num_beams=1,
        )[0].tolist()
    expected = generated if generated[: len(prompt)] == prompt else prompt + generated
    assert ours == expected[:MAX_LENGTH]
