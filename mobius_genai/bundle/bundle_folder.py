"""Is this folder a bundle? One answer for every command that takes one (`run`, `chat`,
`bench`, `validate`), with the hint a checkpoint folder needs: it is what `package` takes."""

from __future__ import annotations

from pathlib import Path

from mobius_genai.errors import BundleError

#: onnxruntime-genai's configuration file: what makes a folder a bundle.
GENAI_CONFIG = "genai_config.json"


def require_bundle(folder: str | Path) -> None:
    """A BundleError unless `folder` holds genai_config.json (`checkpoint_hint` added)."""
    if not (Path(folder) / GENAI_CONFIG).is_file():
        raise BundleError(
            f"{folder}: not a bundle (no {GENAI_CONFIG}); accepted: a folder written by "
            f"`mobius-genai package`{checkpoint_hint(folder)}"
        )


def checkpoint_hint(folder: str | Path) -> str:
    """For a folder without genai_config.json that holds a checkpoint's config.json: the
    words that say to package it; else nothing."""
    if (Path(folder) / "config.json").is_file():
        return f"; it looks like a checkpoint: `mobius-genai package {folder}` makes a bundle of it"
    return ""
