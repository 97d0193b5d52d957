"""Staging folders beside OUT, and the swap that puts a finished one in OUT's place.

A staging folder's name records the process that made it (a hash of the host name and the
pid), so a later run for the same OUT tells the leftovers of a killed process (SIGKILL, power
loss) from the folder of a build still running, and removes only the former, or finishes the
swap such a process was killed in the middle of (`recover_stale`: `package`, and `run`, `chat`,
`bench` and `validate` of OUT, do so first). The name stays
short whatever OUT's name (NAME_MAX is 255 bytes). The swap's renames run with SIGINT and
SIGTERM held back, so OUT always holds the old or the new bundle.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

from mobius_genai._signals import signals_held

#: Characters of OUT's name that start a staging name, for whoever reads a folder listing:
#: 4 bytes each at most, so the whole name stays far below NAME_MAX.
_PREFIX_CHARS = 32
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_NAME = re.compile(
    r"\..*\.(?P<out>[0-9a-f]{12})\.(?P<host>[0-9a-f]{8})\.(?P<pid>[0-9]{1,10})\.[0-9a-f]{8}"
    r"\.(?P<kind>partial|old)",
    re.DOTALL,
)


def sibling(out: Path, kind: str) -> Path:
    """A new hidden name beside `out` for a `kind` ("partial" or "old") folder of this process."""
    return out.with_name(
        f".{out.name[:_PREFIX_CHARS]}.{_key(out)}.{_HOST}.{os.getpid()}."
        f"{uuid.uuid4().hex[:8]}.{kind}"
    )


def _key(out: Path) -> str:
    return hashlib.sha256(os.fsencode(out.name)).hexdigest()[:12]


def recover_stale(out: Path) -> list[str]:
    """Clean up what dead processes of this host left beside `out`; returns a sentence for each
    swap of theirs it completed, for the user.

    A process killed between the two renames of a swap (SIGKILL, power loss) left `out` absent,
    the previous bundle moved aside (`.old`) and the new one complete beside it (`.partial`: a
    swap begins only once the bundle is written, validated and smoke-tested): the swap is
    finished, the new bundle renamed into place. A previous bundle moved aside without its
    successor is put back. Other staging folders of dead processes are removed, as is a
    previous bundle beside an `out` that exists (the swap finished). Folders of live processes,
    of other hosts and of other OUTs are left alone.
    """
    key = _key(out)
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    dead: dict[int, dict[str, Path]] = {}
    for name in names:
        match = _NAME.fullmatch(name)
        if match is None or (match["out"], match["host"]) != (key, _HOST):
            continue
        pid = int(match["pid"])
        if not _alive(pid):
            dead.setdefault(pid, {})[match["kind"]] = out.parent / name
    notes = []
    for pid, left in sorted(dead.items()):
        old, new = left.get("old"), left.get("partial")
        if old is not None and not os.path.lexists(out):
            try:
                os.replace(new if new is not None else old, out)
            except OSError:  # another run may be recovering it too: leave it whole
                continue
            notes.append(
                f"output {out}: a mobius-genai process (pid {pid}) was killed while replacing "
                + (
                    "it; finished the replacement: the new bundle it had made is in place"
                    if new is not None
                    else f"it; put back the previous bundle it had moved aside to {old.name}"
                )
            )
        for path in (old, new):
            if path is not None and os.path.lexists(path):
                remove(path)
    return notes


def _alive(pid: int) -> bool:
    """Whether process `pid` may be running; True when that cannot be told safely."""
    if pid == os.getpid() or os.name != "posix":  # on Windows os.kill(pid, 0) sends Ctrl-C
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    return True


def remove(path: Path) -> None:
    """Remove a staging or backup folder; a link (an OUT that was a link) loses only itself."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def swap(staging: Path, out: Path, backup: Path) -> None:
    """Rename `staging` to `out`; an existing `out` is first renamed to `backup`, and renamed
    back when the second rename fails. Raises the OSError of a failed rename."""
    with signals_held():
        if not os.path.lexists(out):
            os.replace(staging, out)
            return
        try:
            os.replace(out, backup)
            os.replace(staging, out)
        except BaseException:
            if os.path.lexists(backup) and not os.path.lexists(out):
                os.replace(backup, out)
            raise


def add_note(error: BaseException, note: str) -> None:
    """`error.add_note(note)`, also on Python 3.10 (where the CLI still reads `__notes__`)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]
