"""How onnxruntime-genai says things that mobius-genai answers differently (read by the smoke
test's process, which imports little, and by `run`, `chat` and `bench`)."""

from __future__ import annotations

import re

#: How onnxruntime-genai 0.18 says an EP is missing from this build (og.is_webgpu_available()
#: answers True even where ORT lacks WebGPU, so the load error is the reliable signal).
PROVIDER_UNAVAILABLE = re.compile(
    r"not available|not supported in this build|not been built with|Unknown provider name"
    r"|Failed to load library"
)
#: onnxruntime's internals in a message: a source location, then the C++ signature of the
#: function (or its bare name) and the condition that failed ("... was false.").
_INTERNALS = re.compile(
    r"(?:/[^\s:]*/)?\w+\.(?:cc|cpp|h):\d+\s+(?:(?:[\w:<>,*&~]+ )*[\w:<>~]+\([^()]*\)(?: const)?|\w+)"
    r"(?:\s.*? was false\.)?\s*"
)


def og_message(error: BaseException) -> str:
    """onnxruntime-genai's message of `error` on one line, without onnxruntime's source
    locations, C++ signatures and failed conditions, nor a guidance parser's state dump."""
    text = _INTERNALS.sub(" ", str(error).split("\n<", 1)[0])
    return " ".join(text.split()).rstrip(" .:") or type(error).__name__
