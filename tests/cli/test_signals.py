"""Ctrl-C and SIGTERM at any moment of the console script: one line, exit 130/143, no traceback.

The signal is sent to a real `mobius-genai package` process after a delay, so it lands in the
imports, the build or the smoke test, wherever the process is then. The first ~50 ms are
Python's own start (then `main` installs its handlers: importing the CLI imports almost
nothing), which no code of ours can handle; the earliest delay here is past it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bundle.conftest import TINY_QWEN2

ROOT = Path(__file__).resolve().parents[2]

#: Top-level packages the console script must not import before it handles signals.
HEAVY = (
    "numpy",
    "onnx",
    "onnx_ir",
    "onnxscript",
    "onnxruntime",
    "onnxruntime_genai",
    "ml_dtypes",
    "safetensors",
    "huggingface_hub",
    "jsonschema",
    "argparse",
)


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


def _console_script() -> list[str]:
    """The installed `mobius-genai` script, or the same two lines run by this Python."""
    script = Path(sys.executable).with_name("mobius-genai")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from mobius_genai.cli import main; sys.exit(main())"]


def _default_sigint() -> None:
    # A shell starts background jobs with SIGINT ignored, which Python then keeps ignoring.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted(tmp_path: Path, signum: int, delay: float) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out" / "bundle"
    process = subprocess.Popen(
        [*_console_script(), "package", str(TINY_QWEN2), "--ep", "cpu", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
        preexec_fn=_default_sigint,
    )
    time.sleep(delay)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _check(result: subprocess.CompletedProcess[str], signum: int) -> None:
    expected = 130 if signum == signal.SIGINT else 143
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    lines = result.stderr.splitlines()
    assert result.returncode == expected, result.stderr
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"mobius-genai: {word}"), result.stderr


def test_importing_the_cli_is_light():
    """The signal handlers are installed by main(); nothing heavy may run before it."""
    code = (
        "import json, sys; import mobius_genai.cli; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True
    )
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_cli_starts_is_one_line(tmp_path: Path, signum: int):
    _check(_interrupted(tmp_path, signum, 0.3), signum)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.1, 0.2, 1.0, 2.5])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_at_any_moment_of_package_is_one_line(tmp_path: Path, signum: int, delay: float):
    _check(_interrupted(tmp_path, signum, delay), signum)
