"""An onnxruntime session of one of a bundle's graphs, for the smoke test's reference loops.

The smoke test checks onnxruntime-genai against plain onnxruntime runs of the same graphs (the
decoder, a vision-language bundle's vision, embedding and speech graphs, Whisper's encoder):
each opens its graph here, with the ORT config entries the bundle's sessions get laid over it.
Only onnxruntime is imported: the smoke test's process imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import onnxruntime as ort


def ort_session(path: Path, entries: Mapping[str, str], provider: str) -> ort.InferenceSession:
    """A session of the graph at `path` on onnxruntime's `provider` with ORT config `entries`."""
    options = ort.SessionOptions()
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(path), options, providers=[provider])
