"""Read the data files that ship with the package (schemas/, templates/).

A wheel carries them under `mobius_genai/_data/` (pyproject force-include); an editable install
or a source checkout has them at the repository's top level, beside the package.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

_REPOSITORY_ROOT = Path(__file__).resolve().parent.parent


def read_text(relative: str) -> str:
    """Text of a data file, e.g. `read_text("schemas/manifest.schema.json")`."""
    packaged = resources.files("mobius_genai").joinpath("_data", *relative.split("/"))
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = _REPOSITORY_ROOT / relative
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise FileNotFoundError(
        f"data file {relative!r} is neither in mobius_genai/_data nor at {checkout}; "
        "the installation is incomplete"
    )


def read_json(relative: str) -> Any:
    """A data file parsed as JSON."""
    return json.loads(read_text(relative))
