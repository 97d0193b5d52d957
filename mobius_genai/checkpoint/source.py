"""What a model argument is (`classify`: the one place that decides), and a local folder or
hub id resolved to a local folder of checkpoint files.

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
import enum
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json_object
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


class ArgumentKind(enum.Enum):
    """What a model argument names."""

    HUB_ID = "hub id"
    FOLDER = "checkpoint folder"
    GGUF = "GGUF file"
    CONFIG_JSON = "config.json"


@dataclasses.dataclass(frozen=True)
class ModelArgument:
    """A model argument, classified (`classify`).

    `path` is what is read: the folder, the GGUF file (its links followed and checked) or the
    config.json file; None for a hub id. `folder` is the local folder the argument names, when
    it names one (a checkpoint folder, or a folder holding one GGUF file): what an output
    folder may not replace.
    """

    kind: ArgumentKind
    given: str
    path: Path | None = None
    folder: Path | None = None

    @property
    def name(self) -> str:
        """The model's name: a local folder's, a GGUF file's stem or a hub id's last part."""
        if self.folder is not None:
            return self.folder.resolve().name
        if self.kind is ArgumentKind.GGUF and self.path is not None:
            return self.path.stem
        if self.kind is ArgumentKind.CONFIG_JSON and self.path is not None:
            return self.path.resolve().parent.name
        return self.given.rstrip("/").rsplit("/", 1)[-1]


def model_name(model: str | Path) -> str:
    """The name of the model `model` names (`ModelArgument.name`); a text that names no local
    path, such as a hub id or the model_id a manifest records, by its last part."""
    if Path(model).expanduser().exists():
        return classify(model).name
    return ModelArgument(ArgumentKind.HUB_ID, str(model)).name


_ACCEPTED = (
    "accepted: a .gguf file, a local checkpoint folder (the one holding config.json) or a hub "
    "id like 'Qwen/Qwen2.5-0.5B'"
)


def classify(model: str | Path) -> ModelArgument:
    """What `model` names: a local folder holding config.json (or, without one, a single GGUF
    file), a .gguf file, a config.json file, or a hub id ("org/name").

    A ConfigError for anything else: another file, a folder of several GGUF files, a path that
    does not exist, a GGUF file that is a link leading out of its folder (`checkpoint_file`).
    """
    text = str(model)
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelArgument(ArgumentKind.FOLDER, text, path, folder=path)
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ConfigError(
                f"model {text!r}: holds several GGUF files ({', '.join(p.name for p in found)});"
                " accepted: the path of one of them"
            )
        if found:
            return ModelArgument(ArgumentKind.GGUF, text, checkpoint_file(found[0], path), path)
        return ModelArgument(ArgumentKind.FOLDER, text, path, folder=path)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelArgument(ArgumentKind.GGUF, text, checkpoint_file(path, path.parent))
        if path.name == "config.json":
            return ModelArgument(ArgumentKind.CONFIG_JSON, text, path)
        raise file_refused(text)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise ConfigError(
            f"model {text!r}: no such folder, and not a hub id; accepted: a local checkpoint "
            "folder, a .gguf file or a hub id like 'Qwen/Qwen2.5-0.5B'"
        )
    return ModelArgument(ArgumentKind.HUB_ID, text)


def file_refused(given: str) -> ConfigError:
    """The error for a file argument where a checkpoint is needed."""
    return ConfigError(f"model {given!r}: is a file; {_ACCEPTED}")


def resolve_source(
    model: str | Path, revision: str | None = None, *, progress: bool = True
) -> Source:
    """Return the local folder for `model`, downloading from the hub when it is a hub id.

    A hub id is fetched with huggingface_hub, which honours HF_HUB_OFFLINE and the local cache;
    `progress=False` silences its download bars. A file (GGUF, config.json) is refused: it has
    no folder of checkpoint files (`opening.open_checkpoint` opens every kind).
    """
    argument = classify(model)
    if argument.kind is ArgumentKind.HUB_ID:
        return _download(argument.given, revision, progress)
    if argument.kind is ArgumentKind.FOLDER and argument.path is not None:
        return local_source(argument.path, revision)
    raise file_refused(argument.given)


def config_file(model: str | Path, revision: str | None = None) -> Path:
    """config.json of `model`: in its local folder, the file itself, or of a hub id that one
    file alone (from the cache when offline): what is known of a checkpoint before its weights
    are fetched."""
    argument = classify(model)
    if argument.kind is ArgumentKind.FOLDER and argument.path is not None:
        return argument.path / "config.json"
    if argument.kind is ArgumentKind.CONFIG_JSON and argument.path is not None:
        return argument.path
    if argument.kind is not ArgumentKind.HUB_ID:
        raise file_refused(argument.given)
    from huggingface_hub import hf_hub_download

    with _hub_errors(argument.given):
        return Path(hf_hub_download(argument.given, "config.json", revision=revision))


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Load config.json (or the one in folder `path`) as a dict with errors that name the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: config.json not found; a checkpoint folder must hold one")
    return read_json_object(path, ConfigError)


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
