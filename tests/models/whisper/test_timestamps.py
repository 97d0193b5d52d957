"""Timestamp mode: og.Generator with our timestamp rules (`runtime/timestamps.py`, applied
through og's get_logits / set_logits) gives transformers' generate(return_timestamps=True)
token ids, and `run --audio --timestamps` prints the segments transformers' tokenizer reads
from those ids (`decode(..., output_offsets=True)`)."""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
import pytest
import torch
from transformers import GenerationConfig, WhisperTokenizerFast
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

from mobius_genai.cli import main
from mobius_genai.packager import package
from mobius_genai.runtime.timestamps import TimestampRules
from tests.models.whisper._whisper import (
    hf_timestamp_tokens,
    tone,
    write_wav,
    write_whisper_checkpoint,
    write_whisper_tokenizer,
)

NEW_TOKENS = 24
PROMPT = "<|startoftranscript|><|en|><|transcribe|>"
RULES = TimestampRules(no_timestamps=50_363, eos=50_257)


@pytest.fixture(scope="module")
def timed(speech_bundle, multilingual_checkpoint, tmp_path_factory):
    """(og model, transformers' prompt and tokens, the WAV file)."""
    model_hf, _ = multilingual_checkpoint
    wav = write_wav(tmp_path_factory.mktemp("timed") / "tone.wav", tone(3.0))
    og_model = og.Model(str(speech_bundle))
    mel = _inputs(og_model, wav)["audio_features"].as_numpy().copy()
    prompt, tokens = hf_timestamp_tokens(model_hf, mel, NEW_TOKENS)
    return og_model, prompt, tokens, wav


def _inputs(og_model, wav) -> og.NamedTensors:
    """og's processor's inputs (a generator takes them over: one per generator)."""
    return og_model.create_multimodal_processor()(PROMPT, audios=og.Audios.open(str(wav)))


def _og_tokens(og_model, wav, rules: TimestampRules | None) -> list[int]:
    inputs = _inputs(og_model, wav)
    params = og.GeneratorParams(og_model)
    params.set_search_options(max_length=3 + NEW_TOKENS)
    generator = og.Generator(og_model, params)
    generator.set_inputs(inputs)
    tokens: list[int] = []
    while not generator.is_done():
        if rules is not None:
            generator.set_logits(rules.apply(tokens, generator.get_logits()).reshape(1, -1))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def test_og_with_the_rules_gives_transformers_timestamp_tokens(timed):
    og_model, prompt, expected, wav = timed
    assert _inputs(og_model, wav)["input_ids"].as_numpy().tolist() == [prompt]  # no notimestamps
    assert sum(token >= RULES.first_time for token in expected) >= 2  # times were generated
    assert _og_tokens(og_model, wav, RULES) == expected
    assert _og_tokens(og_model, wav, None) != expected  # the rules change the ids


def _hf_tokenizer(bundle) -> WhisperTokenizerFast:
    """transformers' Whisper tokenizer of the bundle's tokenizer.json; `<|notimestamps|>` last
    of its special tokens, as in a released checkpoint, so its time tokens follow it."""
    specials = ["<|startoftranscript|>", "<|notimestamps|>"]
    return WhisperTokenizerFast(
        tokenizer_file=str(bundle / "tokenizer.json"), additional_special_tokens=specials
    )


def _expected_lines(tokenizer: WhisperTokenizerFast, tokens: list[int]) -> list[str]:
    offsets = tokenizer.decode(tokens, output_offsets=True)["offsets"]
    return [
        f"[{item['timestamp'][0]:.2f} -> {item['timestamp'][1]:.2f}] {item['text'].strip()}"
        for item in offsets
    ]


def test_run_timestamps_prints_transformers_segments(timed, speech_bundle, capsys):
    _, _, tokens, wav = timed
    expected = _expected_lines(_hf_tokenizer(speech_bundle), tokens)
    command = ["run", str(speech_bundle), "--audio", str(wav), "--timestamps"]
    code = main([*command, "--max-new-tokens", str(NEW_TOKENS)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert expected and captured.out.splitlines() == expected
    generated = len([token for token in tokens if token != RULES.eos])
    assert f"mobius-genai: {generated} tokens, decode" in captured.err  # one piece per token


def test_run_timestamps_on_an_english_only_bundle(tmp_path, capsys):
    """English-only ids (<|notimestamps|> 50362, end of text 50256), read from the bundle."""
    folder = tmp_path / "ckpt"
    model_hf = write_whisper_checkpoint(folder, "english")
    write_whisper_tokenizer(folder, "english")
    bundle = package(folder, "cpu", tmp_path / "en", quiet=True, smoke_test=False)
    wav = write_wav(tmp_path / "tone.wav", tone(3.0))
    processor = og.Model(str(bundle)).create_multimodal_processor()
    inputs = processor("<|startoftranscript|>", audios=og.Audios.open(str(wav)))
    mel = inputs["audio_features"].as_numpy().copy()
    prompt, tokens = hf_timestamp_tokens(model_hf, mel, NEW_TOKENS, "english")
    assert inputs["input_ids"].as_numpy().tolist() == [prompt] == [[50_257]]
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(bundle / "tokenizer.json"),
        additional_special_tokens=["<|startoftranscript|>", "<|notimestamps|>"],
    )
    expected = _expected_lines(tokenizer, tokens)
    code = main(["run", str(bundle), "--audio", str(wav), "--timestamps", "--max-new-tokens", "24"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert expected and captured.out.splitlines() == expected


def test_the_first_token_is_a_time_up_to_one_second():
    logits = np.zeros(51_865, np.float32)
    logits[11] = 100.0  # a text token the model prefers
    allowed = np.flatnonzero(np.isfinite(RULES.apply([], logits)))
    assert allowed.tolist() == list(range(50_364, 50_364 + 51))


def test_the_rules_mask_what_transformers_processor_masks():
    """Random histories (text, times, pairs, end of text) and logits: the same -inf entries and
    the same kept values as transformers' WhisperTimeStampLogitsProcessor."""
    config = GenerationConfig(
        no_timestamps_token_id=50_363, eos_token_id=50_257, max_initial_timestamp_index=50
    )
    processor = WhisperTimeStampLogitsProcessor(config, begin_index=3)
    rng = np.random.default_rng(0)
    for _ in range(60):
        history = [
            int(rng.integers(50_364, 51_865))
            if rng.random() < 0.4
            else int(rng.integers(0, 50_258))
            for _ in range(int(rng.integers(0, 6)))
        ]
        logits = rng.standard_normal(51_865).astype(np.float32) * 3
        logits[50_364:] += float(rng.normal(-2.0, 1.5))  # times more or less likely together
        ids = torch.tensor([[50_258, 50_259, 50_359, *history]])
        expected = processor(ids, torch.from_numpy(logits[None].copy()))[0].numpy()
        np.testing.assert_array_equal(RULES.apply(history, logits), expected)
