"""onnxruntime-genai 0.18 runs our Whisper graphs end to end on CPU: og.Model loads a bundle
folder written by hand (tests/whisper/_whisper.write_bundle), og.Generator encodes the log-mel
of generated audio once and decodes greedily from the forced prompt; its tokens equal
transformers' generate() with the same prompt on the same features."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
import pytest
import torch
from transformers import WhisperFeatureExtractor

from tests.whisper._whisper import FORCED_PROMPT, tone, write_bundle

MAX_LENGTH = 24

# The decoder role admits GQAFusion, which Whisper's decoder (no attention_mask) cannot take.
pytestmark = pytest.mark.filterwarnings("ignore:GQA fusion expected:UserWarning")


def _og_greedy(bundle, mel: np.ndarray, prompt: list[int]) -> list[int]:
    model = og.Model(str(bundle))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, do_sample=False)
    generator = og.Generator(model, params)
    inputs = og.NamedTensors()
    inputs["audio_features"] = mel
    generator.set_inputs(inputs)
    generator.append_tokens(np.array([prompt], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(token) for token in generator.get_sequence(0)]


def test_og_greedy_tokens_equal_transformers_generate(whisper_checkpoint, tmp_path):
    layout, model, folder = whisper_checkpoint
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    mel = extractor(tone(), sampling_rate=16_000, return_tensors="np").input_features
    prompt = FORCED_PROMPT[layout]
    ours = _og_greedy(write_bundle(folder, tmp_path / "bundle"), mel.astype(np.float32), prompt)
    model.generation_config.suppress_tokens = None  # og suppresses nothing
    model.generation_config.begin_suppress_tokens = None
    with torch.no_grad():
        generated = model.generate(
            input_features=torch.from_numpy(mel),
            decoder_input_ids=torch.tensor([prompt]),
            max_new_tokens=MAX_LENGTH - len(prompt),
            do_sample=False,
            num_beams=1,
        )[0].tolist()
    expected = generated if generated[: len(prompt)] == prompt else prompt + generated
    assert ours[: len(prompt)] == prompt
    assert len(ours) == MAX_LENGTH, layout
    assert ours == expected[:MAX_LENGTH], layout
