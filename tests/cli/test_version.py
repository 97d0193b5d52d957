"""`mobius-genai --version` prints the installed version and exits 0."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from mobius_genai.cli import main


def test_version(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    expected = importlib.metadata.version("mobius-genai")
    assert capsys.readouterr().out == f"mobius-genai {expected}\n"


def test_python_m_mobius_genai_is_the_command():
    """`python -m mobius_genai` where the console script is not on PATH (isolated: -I)."""
    done = subprocess.run(
        [sys.executable, "-I", "-m", "mobius_genai", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    expected = importlib.metadata.version("mobius-genai")
    assert (done.returncode, done.stdout) == (0, f"mobius-genai {expected}\n")
    done = subprocess.run(
        [sys.executable, "-I", "-m", "mobius_genai", "validate", "/nonexistent/bundle"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("mobius-genai: error: /nonexistent/bundle: not a folder")
