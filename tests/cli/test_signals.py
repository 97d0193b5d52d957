"""Ctrl-C and SIGTERM at any moment of the console script: one line, exit 130/143, no traceback.

The signal is sent to a real `mobius-genai package` process a delay after `main` installed its
SIGTERM handler (seen in /proc), so it lands in the imports or the build, wherever the process
is then, whatever the machine's load. Before that is Python's own start (~30 ms) and the import
of the CLI, which imports almost nothing (checked here), so `main` starts within ~50 ms;
tests/runtime/test_smoke_process.py sends signals during the smoke test.
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

from tests.conftest import TINY_QWEN2

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


def _packaging(tmp_path: Path, script: list[str], *options: str) -> subprocess.Popen[str]:
    """`script` (the console script, or Python code doing what it does) packaging the tiny
    checkpoint for cpu with `options`, in `tmp_path`, Ctrl-C not ignored."""
    return subprocess.Popen(
        [*script, "package", str(TINY_QWEN2), "--ep", "cpu", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
        preexec_fn=_default_sigint,
    )


def _interrupted(tmp_path: Path, signum: int, delay: float) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out" / "bundle"
    process = _packaging(tmp_path, _console_script(), "-o", str(out))
    _wait_for_the_sigterm_handler(process.pid)
    time.sleep(delay)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _wait_for_the_sigterm_handler(pid: int) -> None:
    """Until the process catches SIGTERM (its SigCgt mask in /proc), where /proc exists."""
    status = Path(f"/proc/{pid}/status")
    deadline = time.monotonic() + 60
    while status.is_file() and time.monotonic() < deadline:
        caught = next(
            (
                line.split()[1]
                for line in status.read_text().splitlines()
                if line.startswith("SigCgt")
            ),
            "0",
        )
        if int(caught, 16) & 1 << (signal.SIGTERM - 1):
            return
        time.sleep(0.002)


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
    _check(_interrupted(tmp_path, signum, 0.05), signum)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.2, 0.5, 1.0])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_at_any_moment_of_package_is_one_line(tmp_path: Path, signum: int, delay: float):
    _check(_interrupted(tmp_path, signum, delay), signum)


#: The console script's two lines, after an exit handler that says when the process is exiting
#: and keeps it exiting for a while (as closing worker processes or freeing a model can).
_SLOW_EXIT = (
    "import atexit, sys, time; "
    "atexit.register(lambda: print('exiting', file=sys.stderr, flush=True) or time.sleep(60)); "
    "from mobius_genai.cli import main; sys.exit(main())"
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_bundle_is_written_is_one_line(tmp_path: Path, signum: int):
    out = tmp_path / "out"
    process = _packaging(
        tmp_path, [sys.executable, "-c", _SLOW_EXIT], "-o", str(out), "--no-smoke-test"
    )
    said = []
    for line in process.stderr:
        said.append(line)
        if line == "exiting\n":  # main has returned, "bundle written" said: the process exits
            break
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=30)
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    assert process.returncode == 128 + signum, stderr
    assert "bundle written to" in said[-2] and stdout == f"{out}\n"
    assert stderr == f"mobius-genai: {word} after the command finished; what it wrote is complete\n"
    assert (out / "genai_config.json").is_file()


class _Interrupting:
    """A stdout whose writing is interrupted by Ctrl-C."""

    def write(self, text: str) -> int:
        raise KeyboardInterrupt

    def flush(self) -> None:
        pass


def test_ctrl_c_while_saying_where_the_bundle_is_says_it_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from mobius_genai.cli import _package, main

    real = _package.package

    def package(*args, **kwargs):
        folder = real(*args, **kwargs)
        monkeypatch.setattr(sys, "stdout", _Interrupting())
        return folder

    monkeypatch.setattr(_package, "package", package)
    out = tmp_path / "out"
    argv = ["package", str(TINY_QWEN2), "-o", str(out), "--quiet", "--no-smoke-test"]
    assert main(argv) == 130
    monkeypatch.undo()
    assert capsys.readouterr().err == (
        f"mobius-genai: interrupted; output {out}: the new bundle is complete and in place\n"
    )
    assert (out / "genai_config.json").is_file()
