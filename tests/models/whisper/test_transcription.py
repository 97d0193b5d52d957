"""A transcript's windows and timed segments (`runtime/transcription.py`, what serve's srt, vtt
and verbose_json show) against transformers' `generate(return_timestamps=True)` on the same
log-mel: a clip within one window (short-form: `seek` moves within it) and a 60 s WAV in two
pieces (long-form), segment by segment (start, end, tokens); a prompt; the language a
translation detects; the no-speech probability and mean log-probability of a window."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import WhisperFeatureExtractor

from mobius_genai.cli import main
from mobius_genai.runtime.audio import Clip, tone_bytes
from mobius_genai.runtime.audio_length import audio_length
from mobius_genai.runtime.opening import open_bundle
from mobius_genai.runtime.transcription import (
    TranscriptRequest,
    clip_features,
    transcript_steps,
)
from tests._writes import Writes
from tests.models.whisper._whisper import pcm16, tone, write_encoded, write_wav

WINDOW_TOKENS = 24
PROMPT_TEXT = "Hi there"


def _ours(bundle: Path, wav: bytes, **asked: object):
    opened = open_bundle(bundle, command="run")
    request = TranscriptRequest(**{"timestamps": True, "window_tokens": WINDOW_TOKENS, **asked})
    steps = transcript_steps(opened, Clip(wav, "file"), request)
    with pytest.raises(StopIteration) as done:
        while True:
            next(steps)
    return done.value.value, clip_features(opened, Clip(wav, "file"))[0]


def _configured(model):
    """transformers' generation config of a released multilingual checkpoint, timestamps on,
    no suppressed tokens (onnxruntime-genai applies none)."""
    config = model.generation_config
    config.no_timestamps_token_id = 50_363
    config.max_initial_timestamp_index = 50
    config.is_multilingual = True
    config.decoder_start_token_id = 50_258
    config.prev_sot_token_id = 50_361
    config.suppress_tokens = config.begin_suppress_tokens = None
    config.lang_to_id = {"<|en|>": 50_259, "<|fr|>": 50_260}
    config.task_to_id = {"translate": 50_358, "transcribe": 50_359}
    return model


def _theirs(model, mel: np.ndarray, **options: object) -> list[tuple[float, float, list[int]]]:
    with torch.no_grad():
        out = _configured(model).generate(
            input_features=torch.from_numpy(mel),
            return_timestamps=True,
            return_dict_in_generate=True,
            return_segments=True,
            language="en",
            task="transcribe",
            max_new_tokens=WINDOW_TOKENS,
            **options,
        )
    return [
        (round(float(s["start"]), 6), round(float(s["end"]), 6), s["tokens"].tolist())
        for s in out["segments"][0]
    ]


def _segments(transcript) -> list[tuple[float, float, list[int]]]:
    return [(round(s.start, 6), round(s.end, 6), list(s.tokens)) for s in transcript.segments]


def test_a_clip_within_one_window_segments_as_transformers(speech_bundle, multilingual_checkpoint):
    """30 s: windows from `seek` inside the one log-mel, as transformers' short-form loop."""
    model, _ = multilingual_checkpoint
    found, mel = _ours(speech_bundle, tone_bytes(30.0))
    assert mel.shape[-1] == 3000
    expected = _theirs(model, mel)
    assert len({seek for seek in (s.seek for s in found.segments)}) >= 2  # seek moved on
    assert _segments(found) == expected
    assert found.text == "".join(segment.text for segment in found.segments)


def test_a_long_wav_segments_as_transformers_long_form(speech_bundle, multilingual_checkpoint):
    """60 s in two 30 s pieces, their log-mels joined: transformers' long-form decoding of the
    same log-mel gives the same segments, times offset by each window's start."""
    model, _ = multilingual_checkpoint
    found, mel = _ours(speech_bundle, tone_bytes(60.0))
    assert mel.shape[-1] == 6000 and found.duration == 60.0
    assert max(s.start for s in found.segments) > 30
    assert _segments(found) == _theirs(model, mel, attention_mask=torch.ones(1, 6000))


#: 60 s of WAV (two 30 s pieces); 59.904 s of FLAC: two pieces of 117 frames of 4096 samples;
#: 60 s of MP3 (its frames: 60.084 s with LAME's delay and padding), in pieces of whole frames.
LONG = {".wav": 60.0, ".flac": 2 * 117 * 4096 / 16_000, ".mp3": 60.0}


@pytest.mark.parametrize("suffix", sorted(LONG))
def test_run_audio_prints_transformers_long_form_segments(
    speech_bundle, multilingual_checkpoint, tmp_path, capsys, suffix
):
    """`mobius-genai run --audio --format verbose_json` of a long WAV, FLAC or MP3 (their pieces
    end at whole frames, short of 30 s): the segments transformers' long-form decoding gives
    for the same log-mel, up to the audio's end."""
    model, _ = multilingual_checkpoint
    path = tmp_path / f"long{suffix}"
    if suffix == ".wav":
        path.write_bytes(tone_bytes(LONG[suffix]))
    else:
        write_encoded(path, tone(LONG[suffix]))
    options = ["--format", "verbose_json", "--max-new-tokens", str(WINDOW_TOKENS)]
    assert main(["run", str(speech_bundle), "--audio", str(path), *options]) == 0
    printed = json.loads(capsys.readouterr().out)
    mel = clip_features(open_bundle(speech_bundle, command="run"), Clip.read(path))[0]
    found = [(round(s["start"], 6), round(s["end"], 6), s["tokens"]) for s in printed["segments"]]
    duration = audio_length(path.read_bytes()).seconds
    assert printed["duration"] == duration >= LONG[suffix] and max(s[0] for s in found) > 30
    frames = round(duration * 100)
    assert found == _theirs(model, mel[..., :frames].copy())


def test_a_prompt_conditions_the_first_window_as_transformers(
    speech_bundle, multilingual_checkpoint
):
    model, _ = multilingual_checkpoint
    found, mel = _ours(speech_bundle, tone_bytes(30.0), prompt=PROMPT_TEXT)
    encoded = Tokenizer.from_file(str(speech_bundle / "tokenizer.json")).encode(" " + PROMPT_TEXT)
    prompt_ids = torch.tensor([50_361, *encoded.ids])
    unprompted, _ = _ours(speech_bundle, tone_bytes(30.0))
    assert _segments(found) != _segments(unprompted)  # the prompt reached the decoder
    assert _segments(found) == _theirs(model, mel, prompt_ids=prompt_ids)


def test_translation_detects_transformers_language(speech_bundle, multilingual_checkpoint):
    model, _ = multilingual_checkpoint
    found, mel = _ours(speech_bundle, tone_bytes(2.0), task="translate")
    with torch.no_grad():
        detected = _configured(model).detect_language(input_features=torch.from_numpy(mel))
    assert found.task == "translate"
    assert found.language == {50_259: "en", 50_260: "fr"}[int(detected[0])]


def test_a_windows_scores_are_transformers_probabilities(speech_bundle, multilingual_checkpoint):
    """no_speech_prob: softmax at <|startoftranscript|>; avg_logprob: the tokens' log-softmax,
    end of text included when generated, over (tokens + 1), as openai/whisper: from
    transformers' logits of the same sequence (without timestamps: one segment, every token)."""
    model, _ = multilingual_checkpoint
    found, mel = _ours(speech_bundle, tone_bytes(2.0), timestamps=False)
    (segment,) = found.segments
    ended = len(segment.tokens) < WINDOW_TOKENS  # else cut at the window's tokens, no end
    prompt = [50_258, 50_259, 50_359, 50_363]
    ids = torch.tensor([[*prompt, *segment.tokens, *([50_257] if ended else [])]])
    with torch.no_grad():
        logits = model(input_features=torch.from_numpy(mel), decoder_input_ids=ids).logits[0]
    no_speech = torch.softmax(logits[0], -1)[50_362].item()
    assert segment.no_speech_prob == pytest.approx(no_speech, rel=1e-3)
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    total = logprobs.gather(1, ids[0, len(prompt) :, None]).sum().item()
    assert segment.avg_logprob == pytest.approx(total / (len(segment.tokens) + 1), rel=1e-3)


@pytest.mark.parametrize("shown", ["--timestamps", "text"])
def test_run_audio_prints_each_window_while_the_next_decodes(
    speech_bundle, tmp_path, capsys, monkeypatch, shown
):
    """A 60 s WAV: the first window's text (or segment lines) is printed before the second
    window's tokens are decoded (a write per token, so writes follow it), and the whole print
    is the transcript the JSON formats give (their text, or a line per segment)."""
    path = tmp_path / "long.wav"
    path.write_bytes(tone_bytes(60.0))
    command = ["run", str(speech_bundle), "--audio", str(path), "--max-new-tokens", "24"]
    whole_format = "verbose_json" if shown == "--timestamps" else "json"
    assert main([*command, "--format", whole_format]) == 0
    whole = json.loads(capsys.readouterr().out)
    out = Writes()
    monkeypatch.setattr(sys, "stdout", out)
    assert main([*command, "--timestamps" if shown == "--timestamps" else "--format=text"]) == 0
    if shown == "--timestamps":
        lines = [
            f"[{s['start']:.2f} -> {s['end']:.2f}] {s['text'].strip()}" for s in whole["segments"]
        ]
        first = "\n".join(
            line for line, s in zip(lines, whole["segments"], strict=True) if not s["seek"]
        )
        assert out.getvalue() == "\n".join(lines) + "\n"
    else:
        assert out.getvalue() == whole["text"] + "\n"
    printed = next(n for n, text in enumerate(out.writes) if text)
    assert 0 < len(out.writes[printed]) < len(out.getvalue()) - 1
    if shown == "--timestamps":
        assert out.writes[printed] == first
    assert len(out.writes) - printed > 12  # the second window's tokens were decoded after it


def test_a_long_clips_log_mel_is_transformers_of_the_whole_audio(speech_bundle, tmp_path):
    """A 60 s WAV, quieter in its second half: its two pieces' log-mels joined on one scale
    are transformers' WhisperFeatureExtractor of the whole audio (raised to 8 below the whole
    audio's largest value, not each piece's), but for og's edge frames at each piece's ends."""
    signal = tone(60.0)
    signal[30 * 16_000 :] *= 0.1
    path = write_wav(tmp_path / "long.wav", signal)
    mel, _ = clip_features(open_bundle(speech_bundle, command="run"), Clip.read(path))
    extractor = WhisperFeatureExtractor(feature_size=mel.shape[1])
    as_read = pcm16(signal).astype(np.float32) / 32768
    whole = extractor(
        as_read, sampling_rate=16_000, return_tensors="np", truncation=False, padding="longest"
    ).input_features
    edges = [0, 1, 2999, 3000, 3001, 5999]  # og's STFT at a file's start and end
    frames = np.setdiff1d(np.arange(whole.shape[-1] - 1), edges)
    assert mel.shape[-1] >= whole.shape[-1]
    assert np.abs(mel[..., frames] - whole[..., frames]).max() < 1e-4
