"""Images through `mobius-genai serve`, answered to the official `openai` client: an image_url
part (a PNG or JPEG data: URL) on a tiny Qwen2.5-VL bundle gives the text `run --image` gives
for the same prompt and image, streamed or not, beside text requests at the same time; http(s)
URLs only with --allow-image-urls (fetched from a local http.server); each refusal is one 400
naming the part, and the server goes on."""

from __future__ import annotations

import base64
import contextlib
import http.server
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import openai
import pytest

from mobius_genai.cli import main
from mobius_genai.runtime.smoke_image import png_bytes
from tests._jpeg import jpeg_bytes
from tests.serve.conftest import Server

MAX_TOKENS = 5
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
PNG = png_bytes(np.random.default_rng(1).integers(0, 256, (32, 40, 3), dtype=np.uint8))
OTHER_PNG = png_bytes(np.random.default_rng(2).integers(0, 256, (40, 32, 3), dtype=np.uint8))
JPEG = jpeg_bytes(np.random.default_rng(3).integers(0, 256, (4, 5, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def image_server(qwen2_5_vl_bundle: Path) -> Iterator[Server]:
    with Server(qwen2_5_vl_bundle, "--model-name", "any") as running:
        yield running


def _image_part(data: bytes, media_type: str = "image/png") -> dict[str, object]:
    url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def _url_part(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _chat(client: openai.OpenAI, content: object, stream: bool = False, **options: object):
    messages = [{"role": "user", "content": content}]
    options = {"model": "any", "max_tokens": MAX_TOKENS, "temperature": 0, **options}
    reply = client.chat.completions.create(messages=messages, stream=stream, **options)
    if not stream:
        return reply
    return "".join(chunk.choices[0].delta.content or "" for chunk in reply if chunk.choices)


def _run_image(capsys, bundle: Path, tmp_path: Path, prompt: str, *images: bytes) -> str:
    """What `mobius-genai run --image ...` prints on stdout (its last newline left out)."""
    command = ["run", str(bundle), "--prompt", prompt, "--max-new-tokens", str(MAX_TOKENS)]
    for index, data in enumerate(images):
        suffix = "jpg" if data == JPEG else "png"
        path = tmp_path / f"image{index}.{suffix}"
        path.write_bytes(data)
        command += ["--image", str(path)]
    capsys.readouterr()
    assert main(command) == 0
    return capsys.readouterr().out[:-1]


def test_an_image_url_part_gives_run_images_greedy_tokens(
    image_server, qwen2_5_vl_bundle, tmp_path, capsys
):
    """The part's place in the message is where the image placeholder goes; the reply is the
    text `run --image` prints for the same prompt and image (PNG, JPEG, two images), its prompt
    tokens og's processor's."""
    client = image_server.client()
    bundle = qwen2_5_vl_bundle
    reply = _chat(client, [_image_part(PNG), _text("Describe it.")])
    expected = _run_image(capsys, bundle, tmp_path, f"{PLACEHOLDER}Describe it.", PNG)
    assert reply.choices[0].message.content == expected
    assert reply.usage.completion_tokens == MAX_TOKENS
    model = og.Model(str(bundle))
    text = og.Tokenizer(model).apply_chat_template(
        f'[{{"role": "user", "content": "{PLACEHOLDER}Describe it."}}]',
        template_str=(bundle / "chat_template.jinja").read_text(),
        add_generation_prompt=True,
    )
    inputs = model.create_multimodal_processor()(text, images=og.Images.open_bytes(PNG))
    assert reply.usage.prompt_tokens == inputs["input_ids"].as_numpy().shape[-1]

    jpeg = _chat(client, [_text("See "), _image_part(JPEG, "image/jpeg"), _text(" here")])
    run_jpeg = _run_image(capsys, bundle, tmp_path, f"See {PLACEHOLDER} here", JPEG)
    assert jpeg.choices[0].message.content == run_jpeg
    two = [_image_part(PNG), _text(" and "), _image_part(OTHER_PNG), _text(" Compare.")]
    prompt = f"{PLACEHOLDER} and {PLACEHOLDER} Compare."
    run_two = _run_image(capsys, bundle, tmp_path, prompt, PNG, OTHER_PNG)
    assert _chat(client, two).choices[0].message.content == run_two
    without = _chat(client, "Describe it.").choices[0].message.content
    assert len({expected, run_jpeg, run_two, without}) == 4  # each image reached the model


def test_image_and_text_requests_at_once_get_their_replies_alone(image_server):
    """Chats with images (og's multimodal processor, a generator each) and text chats, sent
    together, reply as each does alone, streamed or not."""
    client = image_server.client()
    contents = [
        [_image_part(PNG), _text("Describe it.")],
        "The capital of France is",
        [_text("Look: "), _image_part(OTHER_PNG)],
        [_image_part(JPEG, "image/jpeg"), _text("Hi")],
    ]
    alone = [_chat(client, content).choices[0].message.content for content in contents]
    with ThreadPoolExecutor(len(contents)) as pool:
        together = [
            r.choices[0].message.content for r in pool.map(lambda c: _chat(client, c), contents)
        ]
        streamed = list(pool.map(lambda content: _chat(client, content, stream=True), contents))
    assert together == alone and streamed == alone
    assert len(set(alone)) == len(alone)


@pytest.mark.parametrize(
    ("part", "said"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}},
            "the data after the comma is not base64",
        ),
        (_image_part(PNG[:60]), "onnxruntime-genai cannot process the image"),
        (_image_part(JPEG[:-40], "image/jpeg"), "cut short: no end-of-image marker"),
        (_image_part(b"GIF89a" + bytes(40)), "not a PNG or JPEG image (starts with b'GIF8')"),
        (_image_part(b"RIFF\x1a\0\0\0WEBPVP8L", "image/webp"), "image/webp is not an image type"),
        (_url_part("file:///etc/passwd"), "the scheme 'file:' is not served"),
        (_url_part("http://127.0.0.1:9/a.png"), "this server does not fetch image URLs"),
        (_url_part("data:text/plain;base64,aGk="), "a data: URL of text/plain"),
        (
            {"type": "image_url", "image_url": {"url": "data:,", "detail": "ultra"}},
            'detail "ultra" is not accepted; accepted: auto, low, high',
        ),
        (_text(f"{PLACEHOLDER} Hi"), f"places 1 {PLACEHOLDER} but 0 image(s)"),
        (_text("<|image_pad|> Hi"), "holds <|image_pad|>, the token og fills"),
    ],
    ids=[
        "not base64",
        "undecodable",
        "cut jpeg",
        "gif",
        "webp",
        "file url",
        "http without the flag",
        "not an image type",
        "detail",
        "placeholder without an image",
        "image token without an image",
    ],
)
def test_an_image_that_cannot_be_served_is_one_clear_400(image_server, part, said):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(image_server.client(), [part, _text("Hi")])
    error = caught.value
    assert said in error.message and "accepted" in error.message, error.message
    assert error.body["param"].startswith("messages")
    assert _chat(image_server.client(), "Hi").choices  # nothing left queued; the server goes on


@pytest.mark.parametrize("text", ["<|image_pad|> Hi", "Hi <|image_pad|><|image_pad|>"])
def test_the_image_token_written_beside_an_image_is_a_400_naming_the_part(image_server, text):
    """One more image token than the image has features reached og, whose session run failed
    ("Gather ... out of bounds"): now one 400 naming the image part, before og."""
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(image_server.client(), [_text(text), _image_part(PNG)])
    error = caught.value
    assert "holds <|image_pad|>, the token og fills" in error.message, error.message
    assert "Gather" not in error.message
    assert error.body["param"] == "messages[0].content[1]"
    assert _chat(image_server.client(), "Hi").choices


def test_an_image_to_a_text_only_bundle_names_its_inputs(server):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(server.client(), [_image_part(PNG), _text("Hi")], model="tiny")
    message = caught.value.message
    assert "messages[0].content[0]: the bundle (model.type 'qwen2') takes" in message
    assert "text, no images; accepted: text parts" in message


class _Images(http.server.BaseHTTPRequestHandler):
    """/a.png: PNG; /big.png: more than a MiB; /away: a redirect to ftp:// (urllib's own
    redirects follow ftp; file:// it refuses itself); else 404."""

    def do_GET(self) -> None:
        if self.path == "/away":
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1:9/a.png")
            self.end_headers()
            return
        body = {"/a.png": PNG, "/big.png": PNG + bytes(2 << 20)}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(ConnectionError):  # the server stops reading /big.png
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def image_host() -> Iterator[str]:
    """http://127.0.0.1:PORT of a local http.server serving `_Images`."""
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{host.server_address[1]}"
    finally:
        host.shutdown()
        host.server_close()


def test_allow_image_urls_fetches_http_images(qwen2_5_vl_bundle, image_server, image_host):
    """With the flag an http URL answers as the same image's data: URL does; a missing image,
    one over the body limit and a redirect off http(s) are 400s naming the part."""
    by_data = _chat(image_server.client(), [_image_part(PNG), _text("Describe it.")])
    with Server(
        qwen2_5_vl_bundle, "--model-name", "any", "--allow-image-urls", "--max-body-mib", "1"
    ) as running:
        client = running.client()
        by_url = _chat(client, [_url_part(f"{image_host}/a.png"), _text("Describe it.")])
        assert by_url.choices[0].message.content == by_data.choices[0].message.content
        refusals = [
            ("/missing.png", "the image cannot be fetched (HTTP 404"),
            ("/big.png", f"the image has more than {1 << 20} bytes"),
            ("/away", "a redirect to 'ftp://127.0.0.1:9/a.png', not http(s)"),
        ]
        for path, said in refusals:
            with pytest.raises(openai.BadRequestError) as caught:
                _chat(client, [_text("Hi "), _url_part(image_host + path)])
            assert said in caught.value.message, caught.value.message
            assert caught.value.body["param"] == "messages[0].content[1].image_url.url"
