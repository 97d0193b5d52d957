"""Audio in request bodies, checked before anything runs: input_audio parts of chat messages,
transcription forms, and which of them the served bundle takes."""

from __future__ import annotations

import base64
import importlib.util

import pytest

from mobius_genai.cli import main
from mobius_genai.serve.media import BundleMedia
from mobius_genai.serve.protocol import (
    InputAudio,
    RequestError,
    Transcription,
    chat_request,
    transcription_request,
)


def _part(data: bytes, audio_format: str = "wav") -> dict[str, object]:
    encoded = base64.b64encode(data).decode()
    return {"type": "input_audio", "input_audio": {"data": encoded, "format": audio_format}}


def test_input_audio_parts_are_clips_in_their_place():
    content = [
        {"type": "text", "text": "Before "},
        _part(b"RIFF..."),
        {"type": "text", "text": "!"},
    ]
    generation = chat_request(
        {
            "messages": [
                {"role": "system", "content": "Be brief"},
                {"role": "user", "content": content},
            ]
        }
    )
    clip = InputAudio(b"RIFF...", "wav", "messages[1].content[1].input_audio")
    assert generation.messages[0]["content"] == "Be brief"
    assert generation.messages[1]["content"] == ("Before ", clip, "!")
    assert generation.clips == (clip,)
    assert chat_request({"messages": [{"role": "user", "content": "Hi"}]}).clips == ()


@pytest.mark.parametrize(
    ("part", "param", "said"),
    [
        (
            _part(b"x", "ogg"),
            "messages[0].content[0].input_audio.format",
            "accepted: wav, mp3, flac",
        ),
        (_part(b""), "messages[0].content[0].input_audio.data", "is empty; accepted: a clip"),
        (
            {"type": "input_audio", "input_audio": {"data": "a b", "format": "mp3"}},
            "messages[0].content[0].input_audio.data",
            "is not base64",
        ),
        (
            {"type": "input_audio", "input_audio": "abc"},
            "messages[0].content[0].input_audio",
            "must be an object with data",
        ),
        ({"type": "input_image"}, "messages[0].content[0]", "is not served; accepted: a text"),
    ],
)
def test_bad_input_audio_parts_are_named(part, param, said):
    with pytest.raises(RequestError) as refused:
        chat_request({"messages": [{"role": "user", "content": [part]}]})
    assert refused.value.status == 400 and refused.value.param == param
    assert said in refused.value.message


def test_transcription_forms_are_checked_field_by_field():
    fields = {"model": "m", "language": "fr", "response_format": "text", "temperature": "0.0"}
    assert transcription_request(fields, b"RIFF") == Transcription(b"RIFF", "m", "fr", "text")
    assert transcription_request({}, b"RIFF").response_format == "json"
    fields = {
        "response_format": "verbose_json",
        "temperature": "0.7",
        "prompt": "earlier words",
        "timestamp_granularities[]": ["segment"],
    }
    verbose = transcription_request(fields, b"RIFF")
    assert (verbose.temperature, verbose.prompt, verbose.timestamps) == (0.7, "earlier words", True)
    assert verbose.timestamp_granularities == ("segment",)
    assert not transcription_request({"response_format": "text"}, b"RIFF").timestamps
    translation = transcription_request({"response_format": "srt"}, b"RIFF", "translate")
    assert translation.task == "translate" and translation.timestamps
    refusals = [
        ({}, None, "file", "transcribe"),
        ({"response_format": "xml"}, b"RIFF", "response_format", "transcribe"),
        ({"temperature": "1.5"}, b"RIFF", "temperature", "transcribe"),
        ({"temperature": "warm"}, b"RIFF", "temperature", "transcribe"),
        ({"timestamp_granularities[]": "word"}, b"RIFF", "timestamp_granularities[]", "transcribe"),
        (
            {"timestamp_granularities[]": "segment"},
            b"RIFF",
            "timestamp_granularities[]",
            "transcribe",
        ),
        ({"language": "fr"}, b"RIFF", "language", "translate"),
    ]
    for form, audio, param, task in refusals:
        with pytest.raises(RequestError) as refused:
            transcription_request(form, audio, task)
        message = refused.value.message
        assert refused.value.param == param and ("accepted" in message or "must be" in message)


def _media(model_type: str, **sections: object) -> BundleMedia:
    return BundleMedia("bundle", {"model": {"type": model_type, **sections}})


def test_bundle_media_say_what_each_bundle_takes():
    speech = {"speech": {"filename": "speech.onnx"}}
    gemma4 = _media("gemma4", vision={"filename": "vision.onnx"}, **speech)
    assert gemma4.inputs() == "the bundle (model.type 'gemma4') takes text, images and audio"
    assert (gemma4.placeholder, gemma4.transcribes) == ("<|audio|>", False)
    vision_only = _media("gemma4", vision={}, speech={"config_filename": ""})
    assert vision_only.placeholder is None and not vision_only.takes_audio
    assert vision_only.inputs() == "the bundle (model.type 'gemma4') takes text and images"
    whisper = _media("whisper")
    assert whisper.transcribes and whisper.takes_audio
    assert whisper.inputs() == "the bundle (model.type 'whisper') takes audio to transcribe"
    text = _media("qwen2")
    assert text.inputs() == "the bundle (model.type 'qwen2') takes text"
    two = chat_request({"messages": [{"role": "user", "content": [_part(b"a"), _part(b"b")]}]})
    with pytest.raises(RequestError, match=r"content\[1\].input_audio: a request takes one clip"):
        gemma4.check(two, "/v1/chat/completions")
    with pytest.raises(RequestError, match="takes text, no audio; accepted: text parts"):
        text.check(two, "/v1/chat/completions")
    with pytest.raises(RequestError, match="accepted: POST /v1/audio/transcriptions"):
        whisper.check(chat_request({"messages": [{"role": "user", "content": "Hi"}]}), "/chat")
    route = "/v1/audio/transcriptions"
    with pytest.raises(RequestError, match="a clip goes in a chat message's input_audio part"):
        gemma4.check_transcription(Transcription(b"RIFF"), route)
    english = _media("whisper", vocab_size=51_864)
    english.check_transcription(Transcription(b"RIFF"), route)
    with pytest.raises(RequestError, match="English-only Whisper model .* does not translate"):
        english.check_transcription(Transcription(b"RIFF", task="translate"), "/translations")
    with pytest.raises(
        RequestError, match="language 'fr': not a language of the model's tokenizer; accepted: en"
    ) as refused:
        english.check_transcription(Transcription(b"RIFF", language="fr"), route)
    assert refused.value.param == "language"


def test_serve_without_python_multipart_names_the_extra(monkeypatch, tmp_path, capsys):
    """The transcription form needs python-multipart: a missing one is said before serving."""
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "python_multipart" else found(name, *rest),
    )
    assert main(["serve", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "python-multipart); accepted: pip install 'mobius-genai[serve]'" in err
