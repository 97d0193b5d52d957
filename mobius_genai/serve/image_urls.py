"""http(s) image URLs of a request, fetched only where `serve --allow-image-urls` says so.

Off by default: a server that fetches what requests name reaches whatever its own machine
reaches. When on, each image is fetched once, before the request is queued, on a worker thread
(the event loop goes on), within a time limit and the server's request-body size limit; a
redirect may lead to http(s) only. Any failure is a 400 naming the part.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from mobius_genai.serve.protocol import Generation, InputImage, RequestError

#: Seconds an image URL may take, connecting and reading together.
FETCH_SECONDS = 10.0
_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True)
class ImageUrls:
    """Whether the server fetches image URLs, and within which limits."""

    allowed: bool = False
    max_bytes: int = 4 << 20
    seconds: float = FETCH_SECONDS


async def fetched(generation: Generation, urls: ImageUrls) -> Generation:
    """`generation` with the bytes of each image given by URL; a RequestError where the server
    does not fetch URLs or a fetch fails."""
    wanted = [image for image in generation.images if image.data is None]
    if not wanted:
        return generation
    if not urls.allowed:
        where = f"{wanted[0].where}.image_url.url"
        raise RequestError(
            f"{where}: this server does not fetch image URLs; accepted: the image as a data: "
            "URL (data:image/png;base64,...), or start the server with "
            "`mobius-genai serve --allow-image-urls`",
            param=where,
        )
    data = {}
    for image in wanted:
        data[image.where] = await asyncio.to_thread(fetch_image, image, urls)
    messages = tuple(_with_data(message, data) for message in generation.messages)
    return dataclasses.replace(generation, messages=messages)


def fetch_image(image: InputImage, urls: ImageUrls) -> bytes:
    """The bytes at `image.url`, at most `urls.max_bytes` within `urls.seconds`; a RequestError
    naming the part when they cannot be had."""
    where = f"{image.where}.image_url.url"
    deadline = time.monotonic() + urls.seconds
    opener = urllib.request.build_opener(_HttpRedirects)
    try:
        with opener.open(image.url, timeout=urls.seconds) as response:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > urls.max_bytes:
                raise _too_large(where, urls)
            chunks, size = [], 0
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > urls.max_bytes:
                    raise _too_large(where, urls)
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunks.append(chunk)
    except urllib.error.HTTPError as error:
        raise _failed(where, f"HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise _failed(where, str(error.reason)) from None
    except (TimeoutError, OSError) as error:
        said = f"no answer within {urls.seconds:g} s" if isinstance(error, TimeoutError) else error
        raise _failed(where, str(said)) from None
    if not size:
        raise _failed(where, "the answer is empty")
    return b"".join(chunks)


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects to http(s) only (urllib's own also follows ftp)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if not newurl.lower().startswith(("http://", "https://")):
            raise urllib.error.URLError(f"a redirect to {newurl!r}, not http(s)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _failed(where: str, why: str) -> RequestError:
    return RequestError(
        f"{where}: the image cannot be fetched ({why}); accepted: a URL that answers with a PNG "
        "or JPEG image, or the image as a data: URL",
        param=where,
    )


def _too_large(where: str, urls: ImageUrls) -> RequestError:
    return RequestError(
        f"{where}: the image has more than {urls.max_bytes} bytes; accepted: at most "
        f"{urls.max_bytes} (the server's --max-body-mib)",
        param=where,
    )


def _with_data(message: Mapping[str, Any], data: Mapping[str, bytes]) -> Mapping[str, Any]:
    content = message["content"]
    if not isinstance(content, tuple):
        return message
    parts = tuple(
        dataclasses.replace(part, data=data[part.where])
        if isinstance(part, InputImage) and part.where in data
        else part
        for part in content
    )
    return {**message, "content": parts}
