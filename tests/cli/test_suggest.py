"""A mistyped option or command gets the closest real one suggested."""

from __future__ import annotations

import pytest

from mobius_genai.cli import main


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_option_gets_a_suggestion(capsys):
    err = _usage_error(["package", "some/model", "--quite"], capsys)
    assert "unrecognized arguments: --quite" in err
    assert "did you mean --quiet?" in err


def test_a_mistyped_option_of_another_command_gets_its_own_suggestion(capsys):
    err = _usage_error(["run", "bundle", "--prompt", "hi", "--max-new-tokenz", "5"], capsys)
    assert "did you mean --max-new-tokens?" in err


def test_a_mistyped_command_gets_a_suggestion(capsys):
    err = _usage_error(["pakage", "some/model"], capsys)
    assert "did you mean package?" in err


def test_nothing_close_gets_no_suggestion(capsys):
    err = _usage_error(["package", "some/model", "--zzzzzz"], capsys)
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err
