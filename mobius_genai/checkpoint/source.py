"""Resolve a model argument (local folder or hub id) to a local folder of checkpoint files.

Only the files a bundle needs are fetched: config, safetensors weights, tokenizer and generation
files. Pickled `.bin` weights and checkpoint code are never downloaded, so nothing from the
checkpoint is ever executed.

Nothing is read through a symbolic link that leads out of the checkpoint (`checkpoint_file`):
such a link would ship another file (a key, another model's weights) inside the bundle. The
files a build reads are checked when the source is resolved, before any graph is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

from mobius_genai.errors import ConfigError, MobiusError

#: Checkpoint files a bundle carries beside the graph: tokenizer, chat template, generation
#: defaults. onnxruntime-genai's tokenizer reads tokenizer.json + tokenizer_config.json.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)

#: Files a bundle is made from; everything else in a hub repository is left alone.
HUB_FILE_PATTERNS = (
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    *TOKENIZER_FILES,
)


#: Files of a checkpoint folder that a build or a bundle reads (the links checked).
READ_PATTERNS = (*HUB_FILE_PATTERNS, "*.gguf", "preprocessor_config.json")


@dataclasses.dataclass(frozen=True)
class Source:
    """A checkpoint on local disk, and where it came from.

    `model_id` is what a bundle records as its source: the hub id, or for a local folder its
    name (a hub cache snapshot's hub id), never the folder's path, which would leak a private
    path into a published bundle (the manifest's source hashes identify the files).
    """

    path: Path
    model_id: str
    revision: str | None = None
    weights: Path | None = None
    """The file the model is built from when it is not `path` (a GGUF, whose metadata
    files `path` holds): what a rebuild (the smoke test's twin) opens."""


def resolve_source(
    model: str | Path, revision: str | None = None, *, progress: bool = True
) -> Source:
    """Return the local folder for `model`, downloading from the hub when it is a hub id.

    A hub id is fetched with huggingface_hub, which honours HF_HUB_OFFLINE and the local cache;
    `progress=False` silences its download bars.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return local_source(path, revision)
    return _download(_hub_id(model), revision, progress)


def config_file(model: str | Path, revision: str | None = None) -> Path:
    """config.json of `model`: in its local folder, or of a hub id that one file alone (from
    the cache when offline): what is known of a checkpoint before its weights are fetched."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path / "config.json"
    from huggingface_hub import hf_hub_download

    repo_id = _hub_id(model)
    with _hub_errors(repo_id):
        return Path(hf_hub_download(repo_id, "config.json", revision=revision))


def _hub_id(model: str | Path) -> str:
    """`model` as a hub id, or a ConfigError saying what a model argument may be."""
    path = Path(model).expanduser()
    text = str(model)
    if path.is_file():
        raise ConfigError(
            f"model {text!r}: is a file; accepted: a .gguf file, a local checkpoint folder (the "
            "one holding config.json) or a hub id like 'Qwen/Qwen2.5-0.5B'"
        )
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise ConfigError(
            f"model {text!r}: no such folder, and not a hub id; accepted: a local checkpoint "
            "folder, a .gguf file or a hub id like 'Qwen/Qwen2.5-0.5B'"
        )
    return text


def local_source(path: Path, revision: str | None = None) -> Source:
    """The Source of the local checkpoint folder `path` (see `Source.model_id`); a ConfigError
    when a file it reads links out of it (`check_links`)."""
    path = path.resolve()
    check_links(path)
    repo = path.parent.parent.name if path.parent.name == "snapshots" else ""
    parts = repo.split("--")
    if len(parts) == 3 and parts[0] == "models" and all(parts[1:]):
        return Source(path=path, model_id="/".join(parts[1:]), revision=revision)
    return Source(path=path, model_id=path.name, revision=revision)


def _download(repo_id: str, revision: str | None, progress: bool) -> Source:
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    silence = not progress and not are_progress_bars_disabled()
    if silence:
        disable_progress_bars()
    try:
        with _hub_errors(repo_id):
            folder = snapshot_download(
                repo_id, revision=revision, allow_patterns=list(HUB_FILE_PATTERNS)
            )
    finally:
        if silence:
            enable_progress_bars()
    check_links(Path(folder))
    return Source(path=Path(folder), model_id=repo_id, revision=revision)


@contextlib.contextmanager
def _hub_errors(repo_id: str) -> Iterator[None]:
    """huggingface_hub's errors as one ConfigError naming the hub id."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        yield
    except LocalEntryNotFoundError as error:
        raise ConfigError(
            f"model {repo_id!r}: not in the local cache and the hub cannot be reached "
            f"(offline mode or no network): {error}"
        ) from error
    except (HfHubHTTPError, ValueError, OSError) as error:
        raise ConfigError(
            f"model {repo_id!r}: could not be fetched from the hub: {error}"
        ) from error


def check_links(folder: Path) -> None:
    """Refuse the checkpoint in `folder` when one of the files a build reads (READ_PATTERNS)
    is a symbolic link that leads out of it (`checkpoint_file`)."""
    for pattern in READ_PATTERNS:
        for path in sorted(folder.glob(pattern)):
            checkpoint_file(path, folder)


def checkpoint_file(path: Path, folder: Path, error: type[MobiusError] = ConfigError) -> Path:
    """`path`, a file of the checkpoint in `folder`, with its links followed; `error` when they
    lead out of the checkpoint: the folder, or for a huggingface_hub cache snapshot
    (`models--org--name/snapshots/<revision>`, whose files link to `../../blobs/<sha256>`) the
    model's cache entry `models--org--name`."""
    resolved = path.resolve()
    root = _checkpoint_root(folder)
    if resolved.is_relative_to(root):
        return resolved
    name = path.relative_to(folder) if path.is_relative_to(folder) else path
    how = (
        f"is a symbolic link to {os.readlink(path)}"
        if path.is_symlink()
        else f"leads through a symbolic link to {resolved}"
    )
    where = (
        f"the checkpoint folder {root}"
        if root == folder.resolve()
        else f"the model's huggingface_hub cache entry {root}"
    )
    raise error(
        f"{name}: {how}, out of {where}; accepted: regular files in the checkpoint folder, or "
        "links that stay inside it (a huggingface_hub cache snapshot's links into its "
        "repository's blobs/)"
    )


def _checkpoint_root(folder: Path) -> Path:
    """Where the files of the checkpoint in `folder` may lie: a hub cache snapshot's model cache
    entry, else the folder itself."""
    folder = folder.resolve()
    snapshots, entry = folder.parent, folder.parent.parent
    if snapshots.name == "snapshots" and entry.name.startswith("models--"):
        return entry
    return folder
