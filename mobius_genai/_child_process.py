"""Work in a process of its own (the smoke test, bench's configurations, the chat template's
check, the int4 search's workers): a native crash ends that process only, and its memory is its
own.

Every such process is a fresh interpreter started isolated (`python_command`): with `-I`,
neither the working folder nor PYTHONPATH nor the user's site-packages is on its import path,
so a `numpy.py` or `sitecustomize.py` planted where the user works (a checkpoint folder) never
runs; the folder holding this copy of mobius_genai is put on the path instead, so the process
runs the parent's code (an install, an editable install, a checkout on PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from mobius_genai._signals import signals_held

#: The folder holding this copy of the mobius_genai package.
_ROOT = str(Path(__file__).resolve().parents[1])
#: What the isolated interpreter runs: `_ROOT` on the path (where the install did not put it
#: already: first, ahead of the standard library, only when it is missing), then the module as
#: `python -m` would.
_BOOTSTRAP = (
    "import runpy, sys; root, module = sys.argv[1:]; del sys.argv[1:]; "
    "root in sys.path or sys.path.insert(0, root); "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)
#: A stderr line of a child starting with this names what it does next (for crash messages).
PHASE_PREFIX = "mobius-genai phase: "


def python_command(module: str) -> list[str]:
    """The command that runs `module` like `python -m module`, isolated: no working folder,
    PYTHON* variables or user site-packages on its path, this copy of mobius_genai on it."""
    return [sys.executable, "-I", "-c", _BOOTSTRAP, _ROOT, module]


def ask_child(
    module: str,
    request: Mapping[str, Any],
    on_line: Callable[[str], None] | None = None,
    *,
    timeout: float | None = None,
) -> tuple[int, bytes, bytes]:
    """Run `module` (`python_command`) with `request` (JSON) on its stdin; its exit code,
    stdout and stderr. Its stderr is read as it comes: `on_line` hears each line when it is written.
    A process still running after `timeout` seconds is killed and TimeoutError raised.
    Ctrl-C, SIGTERM or any error here kills the process before it travels on."""
    process = None
    said: list[bytes] = []
    timer, expired = None, threading.Event()
    try:
        with signals_held():  # an interrupt inside Popen would leave the child unowned
            process = subprocess.Popen(
                python_command(module),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=os.name == "posix",  # Ctrl-C reaches this process only
            )
        reader = threading.Thread(
            target=_read_lines, args=(process.stderr, said, on_line), daemon=True
        )
        reader.start()
        if timeout is not None:
            timer = threading.Timer(timeout, _expire, (process, expired))
            timer.start()
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
        if timer is not None:
            timer.cancel()
        if process is not None:
            process.stdout.close()
    if expired.is_set() and process.returncode < 0:
        raise TimeoutError(f"{module} ran past {timeout} s")
    return process.returncode, stdout, b"".join(said)


def _expire(process: subprocess.Popen, expired: threading.Event) -> None:
    expired.set()
    process.kill()


def _read_lines(
    stream: IO[bytes], said: list[bytes], on_line: Callable[[str], None] | None
) -> None:
    with stream:
        for raw in iter(stream.readline, b""):
            said.append(raw)
            if on_line is not None:
                on_line(raw.decode(errors="replace"))


def exit_with_parent(parent: int) -> None:
    """In a child: end this process when `parent` (the one that started it) is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def said_by(stderr: str) -> tuple[list[str], list[str]]:
    """The phases a child's `stderr` names (its PHASE_PREFIX lines, in order) and its other
    lines that are not blank."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    phases = [line.removeprefix(PHASE_PREFIX) for line in lines if line.startswith(PHASE_PREFIX)]
    return phases, [line for line in lines if not line.startswith(PHASE_PREFIX)]


def signal_words(returncode: int) -> str:
    """How a signal ended a process, from its (negative) exit code: "signal 11, SIGSEGV"."""
    number = -returncode
    try:
        return f"signal {number}, {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"
