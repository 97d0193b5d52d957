"""Write a bundle folder safely: staged beside OUT, renamed into place when complete.

Everything is written into a temporary folder beside OUT that is renamed to OUT only when the
bundle is complete and checked. A failure or Ctrl-C leaves neither OUT nor the temporary
folder; an existing OUT is replaced (with `force`) only once its successor is ready. What a
killed process (SIGKILL) leaves is cleaned up by the next run for the same OUT.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from mobius_genai.bundle import _staging
from mobius_genai.checkpoint.source import classify
from mobius_genai.errors import BundleError, OutputExistsError


def check_output(out: Path, *, force: bool) -> None:
    """Refuse an OUT that is a file, or a non-empty folder unless `force`."""
    if out.exists() and not out.is_dir():
        raise BundleError(f"output {out}: exists and is not a folder; accepted: a folder path")
    if out.is_dir() and not force and any(out.iterdir()):
        raise OutputExistsError(out)


def check_not_inside(out: Path, protected: Path, what: str) -> None:
    """Refuse an OUT that is `protected` or one of its parents (replacing it would delete it)."""
    out, protected = out.resolve(), protected.resolve()
    if out == protected or out in protected.parents:
        raise BundleError(
            f"output {out}: would replace {what} {protected}; accepted: a folder outside it"
        )


def checkpoint_folder(model: str | Path) -> tuple[tuple[Path, str], ...]:
    """`protect` for staged_output: the checkpoint's folder when `model` names a local one."""
    folder = classify(model).folder
    return () if folder is None else ((folder, "the checkpoint"),)


@contextlib.contextmanager
def staged_output(
    out: Path,
    *,
    force: bool = False,
    protect: Sequence[tuple[Path, str]] = (),
    say: Callable[[str], None] = lambda note: None,
) -> Iterator[Path]:
    """Yield an empty temporary folder beside `out` that becomes `out` when the block succeeds.

    `out` may not be the current folder or one of its parents, nor any `(path, what)` of
    `protect` (e.g. the checkpoint) or a parent of one: replacing it would delete them. Any
    exception, KeyboardInterrupt included, removes the temporary folder (and the parent folders
    this call created) and leaves an existing `out` untouched; once the swap has begun, `out`
    holds the old or the new bundle whatever happens, and a note on the exception says which.
    Staging folders that killed processes left beside `out` are cleaned up first, and a swap
    one was killed in the middle of is finished (`say` hears it said). Folders that
    cannot be created or replaced (read-only, a file in the way, a mount point) are a
    BundleError naming `out`.
    """
    out = Path(out).absolute()
    for note in _staging.recover_stale(out):
        say(note)
    check_output(out, force=force)
    for path, what in ((Path.cwd(), "the current folder"), *protect):
        check_not_inside(out, path, what)
    created = _first_missing(out.parent)
    staging, backup = _staging.sibling(out, "partial"), _staging.sibling(out, "old")
    swapping = False
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
        swapping = True
        try:
            _staging.swap(staging, out, backup)
        except OSError as error:
            raise BundleError(
                f"output {out}: cannot replace it ({error.strerror or error}); accepted: a "
                "folder that can be renamed (not a mount point), in a folder you can write to"
            ) from error
        _staging.remove(backup)
    except BaseException as error:
        if swapping and os.path.lexists(out) and not os.path.lexists(staging):
            _staging.remove(backup)
            _staging.add_note(error, f"output {out}: the new bundle is complete and in place")
        else:
            shutil.rmtree(staging, ignore_errors=True)
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            _staging.add_note(error, _unchanged(out, backup))
        raise


def _unchanged(out: Path, backup: Path) -> str:
    if os.path.lexists(backup) and not os.path.lexists(out):  # putting it back failed too
        return f"output {out}: nothing was written; the previous bundle is at {backup}"
    return f"output {out}: nothing was written" + (
        "; the folder there is unchanged" if os.path.lexists(out) else ""
    )


def _first_missing(folder: Path) -> Path | None:
    """The outermost missing ancestor-or-self of `folder` (what mkdir(parents=True) creates)."""
    missing = None
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing
