"""Write a bundle folder safely, and copy the checkpoint's tokenizer files into it.

Everything is written into a temporary folder beside OUT that is renamed to OUT only when the
bundle is complete and checked. A failure or Ctrl-C leaves neither OUT nor the temporary
folder; an existing OUT is replaced (with `force`) only once its successor is ready.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from mobius_genai.errors import BundleError

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


def copy_tokenizer_files(source: Path, bundle: Path) -> list[str]:
    """Copy the TOKENIZER_FILES that `source` has into `bundle`; returns the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, bundle / name)
            copied.append(name)
    return copied


def check_output(out: Path, *, force: bool) -> None:
    """Refuse an OUT that is a file, or a non-empty folder unless `force`."""
    if out.exists() and not out.is_dir():
        raise BundleError(f"output {out}: exists and is not a folder; accepted: a folder path")
    if out.is_dir() and not force and any(out.iterdir()):
        raise BundleError(
            f"output {out}: folder exists and is not empty; accepted: a new or empty folder, "
            "or --force (force=True) to replace it"
        )


def check_not_inside(out: Path, protected: Path, what: str) -> None:
    """Refuse an OUT that is `protected` or one of its parents (replacing it would delete it)."""
    out, protected = out.resolve(), protected.resolve()
    if out == protected or out in protected.parents:
        raise BundleError(
            f"output {out}: would replace {what} {protected}; accepted: a folder outside it"
        )


@contextlib.contextmanager
def staged_output(out: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside `out` that becomes `out` when the block succeeds.

    Any exception, KeyboardInterrupt included, removes the temporary folder (and the parent
    folders this call created) and leaves an existing `out` untouched.
    """
    out = Path(out).absolute()
    check_output(out, force=force)
    created = _first_missing(out.parent)
    staging = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()  # unlike tempfile.mkdtemp, keeps the umask's permissions
        yield staging
        check_output(out, force=force)  # something may have appeared there meanwhile
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def _first_missing(folder: Path) -> Path | None:
    """The outermost missing ancestor-or-self of `folder` (what mkdir(parents=True) creates)."""
    missing = None
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _replace(staging: Path, out: Path) -> None:
    """Rename `staging` to `out`; an existing `out` is moved aside first and restored on error."""
    if not out.exists():
        os.replace(staging, out)
        return
    backup = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.old")
    os.replace(out, backup)
    try:
        os.replace(staging, out)
    except BaseException:
        os.replace(backup, out)
        raise
    shutil.rmtree(backup, ignore_errors=True)
