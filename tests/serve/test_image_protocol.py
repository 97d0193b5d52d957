"""image_url parts of request bodies, checked before anything runs, and image URLs fetched
within their time limit."""

from __future__ import annotations

import asyncio
import base64
import socket
import time

import pytest

from mobius_genai.serve.image_urls import ImageUrls, fetch_image, fetched
from mobius_genai.serve.media import BundleMedia
from mobius_genai.serve.protocol import InputImage, RequestError, chat_request


def _data_part(data: bytes, media_type: str = "image/png") -> dict[str, object]:
    url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def test_image_url_parts_are_images_in_their_place():
    content = [
        {"type": "text", "text": "A "},
        _data_part(b"\x89PNG..."),
        {"type": "image_url", "image_url": {"url": "https://example.com/b.jpg", "detail": "low"}},
    ]
    generation = chat_request({"messages": [{"role": "user", "content": content}]})
    first = InputImage(b"\x89PNG...", None, "messages[0].content[1]")
    second = InputImage(None, "https://example.com/b.jpg", "messages[0].content[2]")
    assert generation.messages[0]["content"] == ("A ", first, second)
    assert generation.images == (first, second) and generation.clips == ()


@pytest.mark.parametrize(
    ("part", "param", "said"),
    [
        (
            {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
            "messages[0].content[0].image_url",
            "must be an object with url",
        ),
        (
            _data_part(b"x", "image/gif"),
            "messages[0].content[0].image_url.url",
            "image/gif is not an image type onnxruntime-genai 0.18 decodes",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}},
            "messages[0].content[0].image_url.url",
            "a data: URL of image/png, not base64",
        ),
        (
            _data_part(b""),
            "messages[0].content[0].image_url.url",
            "the image is empty",
        ),
        (
            {"type": "image_url", "image_url": {"url": "ftp://host/a.png"}},
            "messages[0].content[0].image_url.url",
            "the scheme 'ftp:' is not served",
        ),
    ],
)
def test_bad_image_url_parts_are_named(part, param, said):
    with pytest.raises(RequestError) as refused:
        chat_request({"messages": [{"role": "user", "content": [part]}]})
    assert refused.value.status == 400 and refused.value.param == param
    assert said in refused.value.message and "accepted" in refused.value.message


def test_an_image_url_is_fetched_only_when_allowed():
    generation = chat_request(
        {"messages": [{"role": "user", "content": [_data_part(b"png"), _url("http://x/a.png")]}]}
    )
    with pytest.raises(RequestError, match="does not fetch image URLs; accepted: the image as"):
        asyncio.run(fetched(generation, ImageUrls(allowed=False)))
    text_only = chat_request({"messages": [{"role": "user", "content": "Hi"}]})
    assert asyncio.run(fetched(text_only, ImageUrls(allowed=False))) is text_only


def _url(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_host_that_never_answers_is_refused_within_the_time_limit():
    with socket.socket() as listener:  # accepts connections (the backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        image = InputImage(None, f"http://127.0.0.1:{listener.getsockname()[1]}/a.png", "m")
        started = time.monotonic()
        with pytest.raises(RequestError, match=r"m.image_url.url: the image cannot be fetched"):
            fetch_image(image, ImageUrls(allowed=True, seconds=0.5))
        assert time.monotonic() - started < 5


def test_bundle_media_say_which_images_each_bundle_takes():
    def media(model_type: str, **sections: object) -> BundleMedia:
        return BundleMedia("bundle", {"model": {"type": model_type, **sections}})

    qwen = media("qwen2_5_vl", vision={"filename": "vision.onnx"})
    assert qwen.image_placeholder == "<|vision_start|><|image_pad|><|vision_end|>"
    assert qwen.multimodal and qwen.parts() == "text and image_url parts"
    gemma4 = media("gemma4", vision={}, speech={"filename": "speech.onnx"})
    assert gemma4.parts() == "text, image_url and input_audio parts"
    text = media("qwen2")
    assert text.image_placeholder is None and not text.multimodal
    assert media("gemma3").image_placeholder is None  # no vision graph: the text decoder alone
    clip = chat_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_audio",
                            "input_audio": {
                                "data": base64.b64encode(b"RIFF").decode(),
                                "format": "wav",
                            },
                        }
                    ],
                }
            ]
        }
    )
    with pytest.raises(
        RequestError, match="takes text and images, no audio; accepted: text and image_url parts"
    ):
        qwen.check(clip, "/v1/chat/completions")
    image = chat_request({"messages": [{"role": "user", "content": [_data_part(b"GIF89a")]}]})
    with pytest.raises(RequestError, match=r"content\[0\]: not a PNG or JPEG image"):
        qwen.check(image, "/v1/chat/completions")


def test_the_images_of_one_request_are_held_to_the_pixel_limit_together():
    """Each declares 6000 x 6000 pixels (PNG headers: the check reads no further), under the
    limit alone, over it together."""
    qwen = BundleMedia("bundle", {"model": {"type": "qwen2_5_vl", "vision": {}}})
    side = (6000).to_bytes(4, "big")
    header = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + side + side + b"\x08\x02\0\0\0"
    one = chat_request({"messages": [{"role": "user", "content": [_data_part(header)]}]})
    qwen.check(one, "/v1/chat/completions")
    two = chat_request(
        {"messages": [{"role": "user", "content": [_data_part(header), _data_part(header)]}]}
    )
    with pytest.raises(RequestError, match=r"content\[1\]: the request's images hold 72,000,000"):
        qwen.check(two, "/v1/chat/completions")
