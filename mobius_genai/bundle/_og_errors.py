"""How onnxruntime-genai says things that mobius-genai answers differently (read by the smoke
test's process, which imports little, and by `run`)."""

from __future__ import annotations

import re

#: How onnxruntime-genai 0.18 says an EP is missing from this build (og.is_webgpu_available()
#: answers True even where ORT lacks WebGPU, so the load error is the reliable signal).
PROVIDER_UNAVAILABLE = re.compile(
    r"not available|not supported in this build|not been built with|Unknown provider name"
    r"|Failed to load library"
)
