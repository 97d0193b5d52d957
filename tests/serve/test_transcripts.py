"""Transcription formats, translations and their options through `mobius-genai serve`, asked
with the official `openai` client on a tiny Whisper bundle: each format read back against the
transcript og gives directly, the prompts og is fed, and every refusal as one clear 400. The
segment times themselves are checked against transformers in
tests/models/whisper/test_transcription.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import openai
import pytest

from mobius_genai.cli import main
from mobius_genai.packager import package
from mobius_genai.runtime import transcription
from mobius_genai.runtime.audio import Clip, tone_bytes
from mobius_genai.runtime.opening import open_bundle
from mobius_genai.runtime.timestamps import TimestampRules
from mobius_genai.runtime.transcription import TranscriptRequest, transcript_steps
from mobius_genai.serve.transcripts import verbose_json
from tests.models.whisper._whisper import (
    tone,
    write_encoded,
    write_whisper_checkpoint,
    write_whisper_tokenizer,
)
from tests.serve.conftest import Server

TRANSLATE, TRANSCRIBE, START_OF_PREV = 50_358, 50_359, 50_361
_SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n(.*)")
_VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})\n(.*)")


def _bundle(tmp_path_factory: pytest.TempPathFactory, layout: str) -> Path:
    checkpoint = tmp_path_factory.mktemp(f"whisper-{layout}")
    write_whisper_checkpoint(checkpoint, layout)
    write_whisper_tokenizer(checkpoint, layout)
    out = tmp_path_factory.mktemp(f"whisper-{layout}-bundle") / "bundle"
    return package(checkpoint, "cpu", out, quiet=True, smoke_test=False)


@pytest.fixture(scope="module")
def whisper_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bundle(tmp_path_factory, "multilingual")


@pytest.fixture(scope="module")
def whisper_server(whisper_bundle: Path):
    with Server(whisper_bundle, "--model-name", "any") as running:
        yield running


def _direct(bundle: Path, wav: bytes, **asked: object):
    """The transcript og gives in this process, and the prompt ids each window fed og."""
    fed: list[list[int]] = []
    original = transcription._generator

    def recording(opened, ids, mel, length):
        fed.append(list(ids))
        return original(opened, ids, mel, length)

    transcription._generator = recording
    try:
        steps = transcript_steps(
            open_bundle(bundle, command="run"), Clip(wav, "file"), TranscriptRequest(**asked)
        )
        while True:
            next(steps)
    except StopIteration as done:
        return done.value, fed
    finally:
        transcription._generator = original


def _seconds(fields: tuple[str, ...]) -> float:
    hours, minutes, seconds, milliseconds = map(int, fields)
    return hours * 3600 + minutes * 60 + seconds + milliseconds / 1000


def test_every_format_is_the_transcript_og_gives(whisper_server, whisper_bundle):
    """json and text: the text; verbose_json: og's transcript with its segments; srt and vtt:
    a cue per segment at its times, with its text."""
    wav = tone_bytes(3.0)
    expected, fed = _direct(whisper_bundle, wav, timestamps=True)
    assert expected.segments and all(TRANSCRIBE in ids for ids in fed)
    transcripts = whisper_server.client().audio.transcriptions
    file = ("clip.wav", wav)

    verbose = transcripts.create(
        model="any", file=file, response_format="verbose_json", timestamp_granularities=["segment"]
    )
    assert verbose.model_dump(exclude_none=True) == verbose_json(expected)
    first = verbose.segments[0]
    assert first.temperature == 0.0 and first.avg_logprob < 0 and 0 <= first.no_speech_prob <= 1
    assert (
        verbose.task == "transcribe" and verbose.language == "english" and verbose.duration == 3.0
    )

    srt = transcripts.create(model="any", file=file, response_format="srt")
    cues = [_SRT_CUE.fullmatch(cue) for cue in srt.strip("\n").split("\n\n")]
    assert all(cues), srt
    assert [int(cue[1]) for cue in cues] == list(range(1, len(expected.segments) + 1))
    vtt = transcripts.create(model="any", file=file, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n")
    vtt_cues = [_VTT_CUE.fullmatch(cue) for cue in vtt[8:].strip("\n").split("\n\n")]
    assert all(vtt_cues), vtt
    for segment, cue, vtt_cue in zip(expected.segments, cues, vtt_cues, strict=True):
        times = [_seconds(cue.groups()[1:5]), _seconds(cue.groups()[5:9])]
        assert times == pytest.approx([segment.start, segment.end], abs=5e-4)
        assert [_seconds(vtt_cue.groups()[0:4]), _seconds(vtt_cue.groups()[4:8])] == times
        assert cue[10] == vtt_cue[9] == segment.text.strip()

    untimed, _ = _direct(whisper_bundle, wav)
    assert transcripts.create(model="any", file=file).text == untimed.text
    assert transcripts.create(model="any", file=file, response_format="text") == untimed.text


def test_the_first_window_is_og_greedy_with_the_timestamp_rules(whisper_bundle):
    """The segments' tokens are og.Generator's greedy tokens under the timestamp rules, fed
    og's processor's inputs for the same prompt (no transcription code in between)."""
    wav = tone_bytes(3.0)
    found, _ = _direct(whisper_bundle, wav, timestamps=True)
    model = og.Model(str(whisper_bundle))
    prompt = "<|startoftranscript|><|en|><|transcribe|>"
    inputs = model.create_multimodal_processor()(prompt, audios=og.Audios.open_bytes(wav))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=448)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    rules, tokens = TimestampRules(no_timestamps=50_363, eos=50_257), []
    while not generator.is_done():
        generator.set_logits(rules.apply(tokens, generator.get_logits()).reshape(1, -1))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    first = [token for s in found.segments if s.seek == 0 for token in s.tokens]
    assert first and tokens[: len(first)] == first


def test_a_prompt_and_a_translation_reach_og(whisper_server, whisper_bundle):
    """`prompt` goes before the forced ids after <|startofprev|> (first window only); a
    translation's forced ids hold <|translate|> and the language the decoder detects."""
    wav = tone_bytes(2.0)
    _, fed = _direct(whisper_bundle, wav, prompt="  Hi there ")
    encoded = og.Tokenizer(og.Model(str(whisper_bundle))).encode(" Hi there").tolist()
    assert fed[0] == [START_OF_PREV, *encoded, 50_258, 50_259, TRANSCRIBE, 50_363]
    assert all(START_OF_PREV not in ids for ids in fed[1:])
    client = whisper_server.client()
    prompted = client.audio.transcriptions.create(
        model="any", file=("a.wav", wav), prompt="  Hi there "
    )
    assert prompted.text == _direct(whisper_bundle, wav, prompt="  Hi there ")[0].text

    expected, fed = _direct(whisper_bundle, wav, task="translate", timestamps=True)
    detection, *windows = fed  # the language is read after <|startoftranscript|> alone
    assert detection == [50_258] and windows
    language = {50_259: "en", 50_260: "fr"}.get(windows[0][1], "lang")
    assert all(ids[1:3] == [windows[0][1], TRANSLATE] for ids in windows)
    assert expected.language.startswith(language)
    translated = client.audio.translations.create(
        model="any", file=("a.wav", wav), response_format="verbose_json"
    )
    assert translated.model_dump(exclude_none=True) == verbose_json(expected)
    assert translated.task == "translate"


def test_temperature_samples(whisper_server, whisper_bundle):
    """temperature > 0 samples: other tokens than greedy, the same again from the same seed."""
    wav = tone_bytes(2.0)
    greedy, _ = _direct(whisper_bundle, wav, timestamps=True)

    def sample(seed: int):
        steps = transcript_steps(
            open_bundle(whisper_bundle, command="run"),
            Clip(wav, "file"),
            TranscriptRequest(timestamps=True, temperature=1.0),
            np.random.default_rng(seed),
        )
        with pytest.raises(StopIteration) as done:
            while True:
                next(steps)
        return done.value.value

    sampled = sample(0)
    assert [s.tokens for s in sample(0).segments] == [s.tokens for s in sampled.segments]
    assert [s.tokens for s in sampled.segments] != [s.tokens for s in greedy.segments]
    assert {s.temperature for s in sampled.segments} == {1.0}
    served = whisper_server.client().audio.transcriptions.create(
        model="any", file=("a.wav", wav), response_format="verbose_json", temperature=1.0
    )
    assert {s.temperature for s in served.segments} == {1.0}


def test_what_cannot_be_served_is_one_clear_400(whisper_server, tmp_path):
    one = write_encoded(tmp_path / "one.mp3", np.zeros(20 * 16_000, np.float32)).read_bytes()
    mp3 = one + b"\x12\x34" * 50 + one  # frames after other bytes: not cut into windows
    client = whisper_server.client()
    transcripts = client.audio.transcriptions
    file = ("a.wav", tone_bytes(1.0))
    cases = [
        (
            lambda: transcripts.create(
                model="any",
                file=file,
                response_format="verbose_json",
                timestamp_granularities=["word"],
            ),
            'timestamp_granularities[] "word": word timestamps are not implemented; accepted: '
            "segment",
        ),
        (
            lambda: transcripts.create(model="any", file=file, timestamp_granularities=["segment"]),
            "timestamp_granularities[] needs response_format verbose_json, got json",
        ),
        (
            lambda: transcripts.create(model="any", file=file, language="xx"),
            "language 'xx': not a language of the model's tokenizer; accepted: en, fr",
        ),
        (
            lambda: transcripts.create(model="any", file=file, temperature=1.5),
            "temperature must be a number with 0.0 <= temperature <= 1.0",
        ),
        (
            lambda: transcripts.create(model="any", file=file, response_format="xml"),
            'response_format "xml" is not supported by this server; accepted: json, text, srt, '
            "vtt, verbose_json",
        ),
        (
            lambda: client.audio.translations.create(
                model="any", file=file, extra_body={"language": "fr"}
            ),
            "unrecognized translation argument(s): language",
        ),
        (
            lambda: transcripts.create(model="any", file=("long.mp3", mp3)),
            "file: over the encoder's 30 s, and only a WAV, FLAC or MP3 file is cut into windows",
        ),
    ]
    for call, said in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert said in caught.value.message, caught.value.message


def test_a_long_wav_is_transcribed_in_windows(whisper_server, whisper_bundle):
    """A 45 s WAV: cut in 30 s pieces whose log-mels join, decoded a window at a time; its
    segments run past the first window, each window's times offset by its start."""
    wav = tone_bytes(45.0)
    expected, fed = _direct(whisper_bundle, wav, timestamps=True)
    assert len(fed) >= 2 and max(s.seek for s in expected.segments) > 0
    verbose = whisper_server.client().audio.transcriptions.create(
        model="any", file=("long.wav", wav), response_format="verbose_json"
    )
    assert verbose.duration == 45.0
    assert verbose.model_dump(exclude_none=True) == verbose_json(expected)


def test_an_english_only_bundle_does_not_translate(tmp_path_factory):
    bundle = _bundle(tmp_path_factory, "english")
    with Server(bundle, "--model-name", "any") as running:
        client = running.client()
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.translations.create(model="any", file=("a.wav", tone_bytes(1.0)))
        assert client.audio.transcriptions.create(model="any", file=("a.wav", tone_bytes(1.0)))
    assert "an English-only Whisper model (vocab_size 51864, a .en checkpoint), which does " in (
        caught.value.message
    )


RUN_AS_SERVE = {
    "text": ({"response_format": "text"}, ()),
    "srt": ({"response_format": "srt"}, ("--format", "srt")),
    "vtt": ({"response_format": "vtt"}, ("--format", "vtt")),
    "verbose_json": ({"response_format": "verbose_json"}, ("--format", "verbose_json")),
    "json, a prompt, French": (
        {"response_format": "json", "prompt": "Hi there", "language": "fr"},
        ("--format", "json", "--prompt", "Hi there", "--language", "fr"),
    ),
    "FLAC, verbose_json": ({"response_format": "verbose_json"}, ("--format", "verbose_json")),
}


@pytest.mark.parametrize("case", sorted(RUN_AS_SERVE))
def test_run_audio_of_a_long_wav_prints_serves_transcript(
    whisper_server, whisper_bundle, tmp_path, capsys, case
):
    """`mobius-genai run --audio` of a 45 s WAV or FLAC (two windows) prints the body serve
    answers for the same clip and fields (run's default --max-new-tokens for a transcript:
    serve's per-window budget, the decoder's context)."""
    fields, options = RUN_AS_SERVE[case]
    if case.startswith("FLAC"):
        path = write_encoded(tmp_path / "long.flac", tone(45.0))
    else:
        path = tmp_path / "long.wav"
        path.write_bytes(tone_bytes(45.0))
    code = main(["run", str(whisper_bundle), "--audio", str(path), *options])
    out = capsys.readouterr().out
    assert code == 0
    served = whisper_server.client().audio.transcriptions.with_raw_response.create(
        model="any", file=(path.name, path.read_bytes()), **fields
    )
    body = served.http_response.text
    if fields.get("response_format", "json").endswith("json"):
        assert json.loads(out) == json.loads(body)
        assert case == "json, a prompt, French" or len(json.loads(body)["segments"]) >= 2
    else:
        assert body.strip() and out == (body if body.endswith("\n") else body + "\n")
