"""onnxruntime-genai 0.18 runs our Whisper graphs end to end on CPU: og.Model loads a bundle
folder written by hand (tests/models/whisper/_whisper.write_bundle), og.Generator encodes the
log-mel of generated audio once and decodes greedily from the forced prompt; its tokens equal
transformers' generate() with the same prompt on the same features."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
from transformers import WhisperFeatureExtractor

from tests._ort import og_greedy
from tests.models.whisper._whisper import FORCED_PROMPT, hf_new_tokens, tone, write_bundle

NEW_TOKENS = 20


def test_og_greedy_tokens_equal_transformers_generate(whisper_checkpoint, tmp_path):
    layout, model, folder = whisper_checkpoint
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    mel = extractor(tone(), sampling_rate=16_000, return_tensors="np").input_features
    prompt = FORCED_PROMPT[layout]
    inputs = og.NamedTensors()
    inputs["audio_features"] = mel.astype(np.float32)
    inputs["input_ids"] = np.array([prompt], np.int32)
    og_model = og.Model(str(write_bundle(folder, tmp_path / "bundle")))
    ours = og_greedy(og_model, inputs, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    assert ours == hf_new_tokens(model, mel, prompt, NEW_TOKENS), layout
