"""Audio through `mobius-genai serve`, answered to the official `openai` client: a chat message's
input_audio part on a Gemma 4 bundle with a speech graph gives the tokens `run --audio` gives for
the same prompt, beside text requests at the same time; a Whisper bundle transcribes through
POST /v1/audio/transcriptions as `run --audio` does; what cannot be served is one clear 400."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import openai
import pytest

from mobius_genai.cli import main
from mobius_genai.packager import package
from mobius_genai.runtime.audio import tone_bytes
from mobius_genai.runtime.smoke_image import png_bytes
from tests._gemma4_audio import write_gemma4_audio_checkpoint
from tests.models.whisper._whisper import write_whisper_checkpoint, write_whisper_tokenizer
from tests.serve.conftest import Server

MAX_TOKENS = 5


@pytest.fixture(scope="module")
def gemma4_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 4 checkpoint with an audio tower, packaged for cpu."""
    checkpoint = tmp_path_factory.mktemp("serve-gemma4-audio")
    write_gemma4_audio_checkpoint(checkpoint)
    out = tmp_path_factory.mktemp("serve-gemma4-audio-bundle") / "bundle"
    return package(checkpoint, "cpu", out, quiet=True, smoke_test=False)


@pytest.fixture(scope="module")
def whisper_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny multilingual Whisper checkpoint with its tokenizer, packaged for cpu."""
    checkpoint = tmp_path_factory.mktemp("serve-whisper")
    write_whisper_checkpoint(checkpoint, "multilingual")
    write_whisper_tokenizer(checkpoint, "multilingual")
    out = tmp_path_factory.mktemp("serve-whisper-bundle") / "bundle"
    return package(checkpoint, "cpu", out, quiet=True, smoke_test=False)


@pytest.fixture(scope="module")
def audio_server(gemma4_bundle: Path):
    with Server(gemma4_bundle, "--model-name", "any") as running:
        yield running


def _audio_part(wav: bytes, audio_format: str = "wav") -> dict[str, object]:
    data = base64.b64encode(wav).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": audio_format}}


def _chat(client: openai.OpenAI, content: object, **options: object):
    messages = [{"role": "user", "content": content}]
    options = {"max_tokens": MAX_TOKENS, "temperature": 0, **options}
    return client.chat.completions.create(model="any", messages=messages, **options)


def _run(capsys, *arguments: str) -> str:
    """What `mobius-genai run` prints on stdout (its last newline left out)."""
    capsys.readouterr()
    assert main(["run", *arguments]) == 0
    return capsys.readouterr().out[:-1]


def _run_audio(capsys, bundle: Path, wav: bytes, prompt: str, tmp_path: Path) -> str:
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav)
    command = ["--audio", str(clip), "--prompt", prompt, "--max-new-tokens", str(MAX_TOKENS)]
    return _run(capsys, str(bundle), *command)


def test_an_input_audio_part_gives_run_audios_greedy_tokens(
    audio_server, gemma4_bundle, tmp_path, capsys
):
    """The part's place in the message is where the clip's placeholder goes; the reply is the
    text `run --audio` prints for the same prompt, its prompt tokens og's processor's."""
    wav = tone_bytes(0.75)
    reply = _chat(audio_server.client(), [_audio_part(wav), {"type": "text", "text": "Hi"}])
    expected = _run_audio(capsys, gemma4_bundle, wav, "<|audio|>Hi", tmp_path)
    assert reply.choices[0].message.content == expected
    assert reply.usage.completion_tokens == MAX_TOKENS
    without = _chat(audio_server.client(), "Hi").choices[0].message.content
    assert without == _run(capsys, str(gemma4_bundle), "--prompt", "Hi", "--max-new-tokens", "5")
    assert without != expected  # the clip reached the model
    model = og.Model(str(gemma4_bundle))
    tokenizer = og.Tokenizer(model)
    template = (gemma4_bundle / "chat_template.jinja").read_text()
    text = tokenizer.apply_chat_template(
        '[{"role": "user", "content": "<|audio|>Hi"}]',
        template_str=template,
        add_generation_prompt=True,
    )
    inputs = model.create_multimodal_processor()(text, audios=og.Audios.open_bytes(wav))
    assert reply.usage.prompt_tokens == inputs["input_ids"].as_numpy().shape[-1]


def test_an_image_and_a_clip_in_one_message_give_runs_tokens(
    audio_server, gemma4_bundle, tmp_path, capsys
):
    """Gemma 4 E2B takes both: each placeholder where its part is, one processor call with the
    image and the clip, the text `run --image --audio` prints."""
    wav = tone_bytes(0.75)
    png = png_bytes(np.random.default_rng(0).integers(0, 256, (48, 48, 3), dtype=np.uint8))
    image = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }
    content = [image, _audio_part(wav), {"type": "text", "text": "Hi"}]
    reply = _chat(audio_server.client(), content)
    (tmp_path / "a.png").write_bytes(png)
    (tmp_path / "a.wav").write_bytes(wav)
    media = ["--image", str(tmp_path / "a.png"), "--audio", str(tmp_path / "a.wav")]
    expected = _run(
        capsys,
        str(gemma4_bundle),
        *media,
        "--prompt",
        "<|image><|audio|>Hi",
        "--max-new-tokens",
        "5",
    )
    assert reply.choices[0].message.content == expected
    clip_only = _chat(audio_server.client(), content[1:])
    assert reply.usage.prompt_tokens > clip_only.usage.prompt_tokens + 1  # the image's tokens


def test_audio_and_text_requests_at_once_get_their_replies_alone(audio_server):
    """Chats with clips (og's multimodal processor, a generator each) and text completions,
    sent together, reply as each does alone (streamed or not)."""
    client = audio_server.client()
    requests = [
        ("chat", [_audio_part(tone_bytes(0.5)), {"type": "text", "text": "Hi"}]),
        ("text", "The capital of France is"),
        ("chat", [{"type": "text", "text": "Say: "}, _audio_part(tone_bytes(1.0, 300.0))]),
        ("text", "Count: one, two"),
    ]

    def ask(request: tuple[str, object], stream: bool = False) -> str:
        kind, content = request
        if kind == "chat":
            reply = _chat(client, content, stream=stream)
        else:
            options = {"max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
            reply = client.completions.create(model="any", prompt=content, **options)
        if not stream:
            choice = reply.choices[0]
            return choice.message.content if kind == "chat" else choice.text
        pieces = (chunk.choices[0] for chunk in reply if chunk.choices)
        return "".join((c.delta.content or "") if kind == "chat" else c.text for c in pieces)

    alone = [ask(request) for request in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(ask, requests))
        as_streams = list(pool.map(lambda request: ask(request, stream=True), requests))
    assert together == alone and as_streams == alone
    assert len(set(alone)) > 2


@pytest.mark.parametrize(
    ("part", "said"),
    [
        (_audio_part(tone_bytes(0.5), "ogg"), 'format "ogg" is not a format onnxruntime-genai'),
        (_audio_part(b"not audio at all " * 20), "not an audio file onnxruntime-genai can decode"),
        (
            {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}},
            "input_audio.data is not base64",
        ),
        ({"type": "image_url", "image_url": {"url": "data:,"}}, "a data: URL of no media type"),
    ],
    ids=["format", "not audio", "not base64", "image"],
)
def test_audio_og_cannot_decode_is_one_clear_400(audio_server, part, said):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(audio_server.client(), [part, {"type": "text", "text": "Hi"}])
    assert said in caught.value.message and "accepted" in caught.value.message
    assert _chat(audio_server.client(), "Hi").choices  # the server goes on


def test_what_a_prompt_with_audio_cannot_hold_is_one_clear_400(audio_server):
    low_rate = tone_bytes(0.5)
    low_rate = low_rate[:24] + (8000).to_bytes(4, "little") + low_rate[28:]  # fmt rate: 8 kHz
    cases = [
        ([_audio_part(low_rate)], "8000 Hz is sampled below 16000 Hz"),
        ([_audio_part(tone_bytes(31.0))], "31.0 s of audio, over the 30 s"),
        ([_audio_part(tone_bytes(0.5)), _audio_part(tone_bytes(0.5))], "a request takes one clip"),
        ([{"type": "text", "text": "<|audio|> Hi"}], "places 1 <|audio|> but 0 clip(s)"),
    ]
    for content, said in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            _chat(audio_server.client(), content)
        assert said in caught.value.message, caught.value.message


def test_audio_on_a_bundle_without_a_speech_graph_names_its_inputs(chat_bundle):
    with Server(chat_bundle, "--model-name", "any") as running:
        client = running.client()
        with pytest.raises(openai.BadRequestError) as caught:
            _chat(client, [_audio_part(tone_bytes(0.5)), {"type": "text", "text": "Hi"}])
        transcripts = client.audio.transcriptions
        with pytest.raises(openai.BadRequestError, match="accepted: a speech bundle"):
            transcripts.create(model="any", file=("a.wav", tone_bytes(0.5)))
    message = caught.value.message
    assert "the bundle (model.type 'qwen2') takes text, no audio; accepted: text parts" in message


def test_transcriptions_give_run_audios_transcript(whisper_bundle, tmp_path, capsys):
    """POST /v1/audio/transcriptions (the openai client's multipart form) on a Whisper bundle:
    the transcript `run --audio` prints, as JSON or text, in the language asked for; a chat
    request, a bad language or a file og cannot decode is a 400."""
    clip = tmp_path / "clip.wav"
    clip.write_bytes(tone_bytes(1.0))
    command = [str(whisper_bundle), "--audio", str(clip), "--max-new-tokens", "448"]
    expected = {
        language: _run(capsys, *command, "--language", language) for language in ("en", "fr")
    }
    assert expected["en"] != expected["fr"]
    with Server(whisper_bundle, "--model-name", "any") as running:
        client = running.client()
        transcripts = client.audio.transcriptions
        file = ("clip.wav", clip.read_bytes())
        assert transcripts.create(model="any", file=file).text == expected["en"]
        french = transcripts.create(model="any", file=file, language="fr", response_format="text")
        assert french == expected["fr"]
        with ThreadPoolExecutor(3) as pool:
            together = list(
                pool.map(lambda _: transcripts.create(model="any", file=file).text, range(3))
            )
        assert together == [expected["en"]] * 3
        refusals = [
            (lambda: _chat(client, "Hi"), "takes audio to transcribe; accepted: POST /v1/audio"),
            (
                lambda: transcripts.create(model="any", file=file, language="xx"),
                "language 'xx': not a language of the model's tokenizer; accepted: en, fr",
            ),
            (
                lambda: transcripts.create(model="any", file=("a.ogg", b"OggS" + bytes(200))),
                "file: not an audio file onnxruntime-genai can decode",
            ),
        ]
        for call, said in refusals:
            with pytest.raises(openai.BadRequestError) as caught:
                call()
            assert said in caught.value.message, caught.value.message
