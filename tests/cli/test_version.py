"""`mobius-genai --version` prints the installed version and exits 0."""

from __future__ import annotations

import importlib.metadata

import pytest

from mobius_genai.cli import main


def test_version(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    expected = importlib.metadata.version("mobius-genai")
    assert capsys.readouterr().out == f"mobius-genai {expected}\n"
