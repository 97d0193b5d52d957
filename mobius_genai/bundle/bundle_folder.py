"""Is this folder a bundle? One answer for every command that takes one (`run`, `chat`,
`bench`, `validate`), with the hint a checkpoint folder needs: it is what `package` takes."""

from __future__ import annotations

from pathlib import Path

from mobius_genai.errors import BundleError

#: onnxruntime-genai's configuration file: what makes a folder a bundle.
GENAI_CONFIG = "genai_config.json"


def require_bundle(folder: str | Path) -> None:
    """A BundleError unless `folder` holds genai_config.json; for a checkpoint folder (one
    holding config.json) the error says to package it."""
    if (Path(folder) / GENAI_CONFIG).is_file():
        return
    hint = (
        f"; it looks like a checkpoint: `mobius-genai package {folder}` makes a bundle of it"
        if (Path(folder) / "config.json").is_file()
        else ""
    )
    raise BundleError(
        f"{folder}: not a bundle (no {GENAI_CONFIG}); accepted: a folder written by "
        f"`mobius-genai package`{hint}"
    )
