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
from collections.abc import Iterator, Sequence
from pathlib import Path

from mobius_genai.errors import BundleError
from mobius_genai.source import TOKENIZER_FILES


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


def checkpoint_folder(model: str | Path) -> tuple[tuple[Path, str], ...]:
    """`protect` for staged_output: the checkpoint's folder when `model` is a local one."""
    local = Path(model).expanduser()
    return ((local, "the checkpoint"),) if local.is_dir() else ()


@contextlib.contextmanager
def staged_output(
    out: Path, *, force: bool = False, protect: Sequence[tuple[Path, str]] = ()
) -> Iterator[Path]:
    """Yield an empty temporary folder beside `out` that becomes `out` when the block succeeds.

    `out` may not be the current folder or one of its parents, nor any `(path, what)` of
    `protect` (e.g. the checkpoint) or a parent of one: replacing it would delete them. Any
    exception, KeyboardInterrupt included, removes the temporary folder (and the parent folders
    this call created) and leaves an existing `out` untouched. Folders that cannot be created
    or replaced (read-only, a file in the way, a mount point) are a BundleError naming `out`.
    """
    out = Path(out).absolute()
    check_output(out, force=force)
    for path, what in ((Path.cwd(), "the current folder"), *protect):
        check_not_inside(out, path, what)
    created = _first_missing(out.parent)
    staging = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            staging.mkdir()  # unlike tempfile.mkdtemp, keeps the umask's permissions
        except OSError as error:
            raise BundleError(
                f"output {out}: cannot create a folder there ({error.strerror or error}); "
                "accepted: a path in a folder you can write to"
            ) from error
        yield staging
        check_output(out, force=force)  # something may have appeared there meanwhile
        try:
            _replace(staging, out)
        except OSError as error:
            raise BundleError(
                f"output {out}: cannot replace it ({error.strerror or error}); accepted: a "
                "folder that can be renamed (not a mount point), in a folder you can write to"
            ) from error
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
    if backup.is_symlink():  # `out` was a link: the link goes, its target stays
        backup.unlink()
    else:
        shutil.rmtree(backup, ignore_errors=True)
