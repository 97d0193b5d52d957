"""Work in a process of its own (the smoke test, bench's configurations): a native crash ends
that process only, and its memory is its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_genai._signals import signals_held


def ask_child(module: str, request: Mapping[str, Any]) -> tuple[int, bytes, bytes]:
    """Run `python -m module` with `request` (JSON) on its stdin; its exit code, stdout and
    stderr. Ctrl-C, SIGTERM or any error here kills the process before it travels on."""
    process = None
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
        stdout, stderr = process.communicate(json.dumps(request).encode())
    except BaseException:  # Ctrl-C, SIGTERM, anything: the child must not outlive its parent
        if process is not None:
            process.kill()
            process.wait()
        raise
    return process.returncode, stdout, stderr


def child_environment() -> dict[str, str]:
    """This environment, with this copy of mobius_genai first on the child's path."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, path] if path else [root])}
