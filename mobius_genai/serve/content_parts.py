"""The media parts of a chat message in a request body, checked and decoded: OpenAI's
input_audio (a clip in base64) and image_url (a data: URL, or an http(s) URL the server
fetches only when started with --allow-image-urls). Nothing here touches onnxruntime-genai.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from mobius_genai.serve.request_error import RequestError

#: input_audio formats onnxruntime-genai's audio decoder reads (OpenAI's are wav and mp3).
AUDIO_FORMATS = ("wav", "mp3", "flac")
#: data: URL media types of images onnxruntime-genai 0.18's processor decodes.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/jpg")
#: Image types OpenAI takes that og 0.18's decoder does not (libjpeg gets them and ends the
#: process), refused by name.
UNDECODED_IMAGE_TYPES = ("image/webp", "image/gif")
#: image_url.detail values OpenAI defines; og's processor sizes images itself, so each is
#: accepted and none changes the image.
IMAGE_DETAILS = ("auto", "low", "high")


@dataclass(frozen=True)
class InputAudio:
    """A clip of a chat message (OpenAI's input_audio content part), decoded from base64;
    `where` names the part in errors."""

    data: bytes
    format: str
    where: str


@dataclass(frozen=True)
class InputImage:
    """An image of a chat message (OpenAI's image_url content part): a data: URL's bytes, or
    an http(s) URL the server fetches when started with --allow-image-urls (`data` None until
    then); `where` names the part in errors."""

    data: bytes | None
    url: str | None
    where: str


def image_url(where: str, value: Any) -> InputImage:
    """An image_url part: a data: URL decoded here, an http(s) URL kept for the server to fetch
    (or refuse); any other scheme refused."""
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        raise RequestError(
            f"{where}.image_url must be an object with url; accepted: {{'url': "
            "'data:image/png;base64,...'}, or an http(s) URL where the server fetches images",
            param=f"{where}.image_url",
        )
    detail = value.get("detail", "auto")
    if detail not in IMAGE_DETAILS:
        raise RequestError(
            f"{where}.image_url.detail {json.dumps(detail)} is not accepted; accepted: "
            f"{', '.join(IMAGE_DETAILS)}",
            param=f"{where}.image_url.detail",
        )
    url = value["url"]
    scheme = url.partition(":")[0].lower()
    if scheme in ("http", "https"):
        return InputImage(None, url, where)
    if scheme != "data":
        raise RequestError(
            f"{where}.image_url.url: the scheme {scheme + ':'!r} is not served; accepted: a "
            "data: URL (data:image/png;base64,...), or http(s) where the server fetches images",
            param=f"{where}.image_url.url",
        )
    return InputImage(data_url(f"{where}.image_url.url", url), None, where)


def data_url(where: str, url: str) -> bytes:
    """The bytes of a base64 data: URL of an image type og decodes."""
    header, comma, payload = url.partition(",")
    media_type, *parameters = header[len("data:") :].split(";")
    media_type = media_type.strip().lower()
    accepted = "data:image/png;base64,... or data:image/jpeg;base64,..."
    if media_type in UNDECODED_IMAGE_TYPES:
        raise RequestError(
            f"{where}: {media_type} is not an image type onnxruntime-genai 0.18 decodes; "
            f"accepted: PNG or JPEG ({accepted})",
            param=where,
        )
    if not comma or media_type not in IMAGE_TYPES or parameters[-1:] != ["base64"]:
        raise RequestError(
            f"{where}: a data: URL of {media_type or 'no media type'}"
            f"{'' if parameters[-1:] == ['base64'] else ', not base64'}; accepted: {accepted}",
            param=where,
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(
            f"{where}: the data after the comma is not base64; accepted: {accepted}", param=where
        ) from None
    if not data:
        raise RequestError(f"{where}: the image is empty; accepted: {accepted}", param=where)
    return data


def input_audio(where: str, value: Any) -> InputAudio:
    if not isinstance(value, dict) or not isinstance(value.get("data"), str):
        raise RequestError(
            f"{where} must be an object with data (the clip's bytes in base64) and format",
            param=where,
        )
    audio_format = value.get("format")
    if audio_format not in AUDIO_FORMATS:
        raise RequestError(
            f"{where}.format {json.dumps(audio_format)} is not a format onnxruntime-genai "
            f"decodes; accepted: {', '.join(AUDIO_FORMATS)}",
            param=f"{where}.format",
        )
    try:
        data = base64.b64decode(value["data"], validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(
            f"{where}.data is not base64; accepted: the clip's bytes in base64",
            param=f"{where}.data",
        ) from None
    if not data:
        raise RequestError(f"{where}.data is empty; accepted: a clip", param=f"{where}.data")
    return InputAudio(data, audio_format, where)
