"""Work in a process of its own (the smoke test, bench's configurations): a native crash ends
that process only, and its memory is its own."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from mobius_genai._signals import signals_held


def ask_child(
    module: str, request: Mapping[str, Any], on_line: Callable[[str], None] | None = None
) -> tuple[int, bytes, bytes]:
    """Run `python -m module` with `request` (JSON) on its stdin; its exit code, stdout and
    stderr. Its stderr is read as it comes: `on_line` hears each line when it is written.
    Ctrl-C, SIGTERM or any error here kills the process before it travels on."""
    process = None
    said: list[bytes] = []
    try:
        with signals_held():  # an interrupt inside Popen would leave the child unowned
            process = subprocess.Popen(
                [sys.executable, "-m", module],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_environment(),
                start_new_session=os.name == "posix",  # Ctrl-C reaches this process only
            )
        reader = threading.Thread(
            target=_read_lines, args=(process.stderr, said, on_line), daemon=True
        )
        reader.start()
        with contextlib.suppress(BrokenPipeError), process.stdin:  # a child dead at once
            process.stdin.write(json.dumps(request).encode())
        stdout = process.stdout.read()
        process.wait()
        reader.join()
    except BaseException:  # Ctrl-C, SIGTERM, anything: the child must not outlive its parent
        if process is not None:
            process.kill()
            process.wait()
        raise
    finally:
        if process is not None:
            process.stdout.close()
    return process.returncode, stdout, b"".join(said)


def _read_lines(
    stream: IO[bytes], said: list[bytes], on_line: Callable[[str], None] | None
) -> None:
    with stream:
        for raw in iter(stream.readline, b""):
            said.append(raw)
            if on_line is not None:
                on_line(raw.decode(errors="replace"))


def child_environment() -> dict[str, str]:
    """This environment, with this copy of mobius_genai first on the child's path."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, path] if path else [root])}
