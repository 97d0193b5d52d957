"""Reading and writing JSON files; read errors name the file (config.json, genai_config.json, ...)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from mobius_genai.errors import MobiusError

__all__ = ["read_json", "read_json_object", "write_json"]


def read_json(path: Path, error: type[MobiusError], label: str | None = None) -> Any:
    """The document in `path`; `error` naming `label` (default: the path) when unreadable.

    Python's json raises ValueError for integers longer than `sys.get_int_max_str_digits()`
    and RecursionError for deep nesting; a hostile file gets the same one-line error.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as cause:
        raise error(f"{label or path}: not readable as JSON ({cause})") from cause
    except ValueError as cause:  # only integer conversion raises another ValueError
        digits = sys.get_int_max_str_digits()
        raise error(
            f"{label or path}: not readable as JSON (an integer with more than {digits} "
            f"digits); accepted: integers of at most {digits} digits"
        ) from cause
    except RecursionError:
        raise error(
            f"{label or path}: not readable as JSON (nested too deeply); accepted: arrays and "
            f"objects nested fewer than {sys.getrecursionlimit()} levels"
        ) from None


def read_json_object(
    path: Path, error: type[MobiusError], label: str | None = None
) -> dict[str, Any]:
    """`read_json` of a file that must hold a JSON object."""
    document = read_json(path, error, label)
    if not isinstance(document, dict):
        raise error(f"{label or path}: expected a JSON object, found {type(document).__name__}")
    return document


def write_json(path: Path, document: Any) -> None:
    """Write `document` (indented, trailing newline) as a new file that replaces `path`.

    Written beside it and renamed over it: never half a file, and never through a hard link
    into someone else's copy (Olive's cache links bundle files).
    """
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
