"""The beginning-of-sequence token a checkpoint's tokenizer adds to every encoding, which
onnxruntime-genai's tokenizer leaves out.

Gemma's tokenizer_config.json says ``add_bos_token: true`` and its tokenizer.json's
post-processor adds ``<bos>``; transformers follows them, onnxruntime-genai 0.18's tokenizer does
not, and Gemma without its ``<bos>`` continues a prompt as if it were noise. So every encoding
mobius-genai feeds a model (`run`, the smoke test) goes through `with_bos`, and the card shows
`og` users the same. Only JSON is read here: the smoke test's process imports this.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_CONFIG = "tokenizer_config.json"
_TOKENIZER = "tokenizer.json"


def required_bos(folder: str | Path) -> int | None:
    """The id of the bos token the bundle's (or checkpoint's) tokenizer_config.json asks to
    start every encoding with (``add_bos_token`` and ``bos_token``), None when it asks for none
    or names a token neither it nor tokenizer.json gives an id."""
    config = _read(Path(folder) / _CONFIG)
    token = config.get("bos_token")
    if isinstance(token, Mapping):  # {"content": "<bos>", ...} in older configs
        token = token.get("content")
    if config.get("add_bos_token") is not True or not isinstance(token, str):
        return None
    added = config.get("added_tokens_decoder") or {}
    for key, entry in added.items():
        if isinstance(entry, Mapping) and entry.get("content") == token and key.isdigit():
            return int(key)
    for entry in _read(Path(folder) / _TOKENIZER).get("added_tokens") or []:
        if isinstance(entry, Mapping) and entry.get("content") == token:
            return int(entry["id"])
    return None


def with_bos(ids: Iterable[int], bos: int | None) -> list[int]:
    """`ids` starting with `bos` once: prepended unless the text already began with it (a chat
    template that writes ``{{ bos_token }}``)."""
    ids = [int(token) for token in ids]
    if bos is None or ids[:1] == [bos]:
        return ids
    return [bos, *ids]


def _read(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # a missing or broken tokenizer file is validate's to report
    return document if isinstance(document, dict) else {}
