"""Reading and writing JSON files; read errors name the file (config.json, genai_config.json, ...)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mobius_genai.errors import MobiusError

__all__ = ["read_json", "read_json_object", "write_json"]


def read_json(path: Path, error: type[MobiusError], label: str | None = None) -> Any:
    """The document in `path`; `error` naming `label` (default: the path) when unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as cause:
        raise error(f"{label or path}: not readable as JSON ({cause})") from cause


def read_json_object(path: Path, error: type[MobiusError]) -> dict[str, Any]:
    """`read_json` of a file that must hold a JSON object."""
    document = read_json(path, error)
    if not isinstance(document, dict):
        raise error(f"{path}: expected a JSON object, found {type(document).__name__}")
    return document


def write_json(path: Path, document: Any) -> None:
    """Write `document` (indented, trailing newline) as a new file that replaces `path`.

    Written beside it and renamed over it: never half a file, and never through a hard link
    into someone else's copy (Olive's cache links bundle files).
    """
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
