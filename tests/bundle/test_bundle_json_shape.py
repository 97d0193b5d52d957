"""A bundle's genai_config.json or mobius_manifest.json of another shape (`[]`, a string, a
number, a `model` that is a list, ...) is one line naming the file and what it must be, in every
command that reads it, checked before any field is read (`schema.read_bundle_json`)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mobius_genai.cli import main
from tests.conftest import TINY_QWEN2


def _model_is(value: Any) -> Callable[[dict], Any]:
    def edit(document: dict) -> dict:
        document["model"] = value
        return document

    return edit


def _decoder_is(value: Any) -> Callable[[dict], Any]:
    def edit(document: dict) -> dict:
        document["model"]["decoder"] = value
        return document

    return edit


#: Shape → (edit of the document, what the error says of it).
SHAPES: dict[str, tuple[Callable[[dict], Any], str]] = {
    "a list": (lambda document: [], "(top level): [] is not of type 'object'"),
    "a string": (lambda document: "model", "(top level): 'model' is not of type 'object'"),
    "a number": (lambda document: 3, "(top level): 3 is not of type 'object'"),
    "null": (lambda document: None, "(top level): None is not of type 'object'"),
    "model a list": (_model_is([1, 2]), "model: [1, 2] is not of type 'object'"),
    "decoder a string": (_decoder_is("x"), "model.decoder: 'x' is not of type 'object'"),
    "a long list": (
        lambda document: list(range(10**5)),
        "(top level): [0, 1, 2, 3, 4, 5, 6, 7, ...] is",
    ),
}

COMMANDS = {
    "run": ["--prompt", "Hi", "--max-new-tokens", "2"],
    "chat": ["--max-new-tokens", "2"],
    "bench": ["--prompt-lengths", "4", "--new-tokens", "2", "--rounds", "1"],
    "validate": [],
}


def _edit(path: Path, edit: Callable[[dict], Any]) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_checks_genai_configs_shape_first(
    bundle_copy, capsys, monkeypatch: pytest.MonkeyPatch, command: str, shape: str
):
    folder = bundle_copy()
    edit, said = SHAPES[shape]
    _edit(folder / "genai_config.json", edit)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert main([command, str(folder), *COMMANDS[command]]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"mobius-genai: error: genai_config.json: {said}"), err
    assert err.count("\n") == 1 and len(err) < 300


@pytest.mark.parametrize("shape", ["a list", "a string"])
def test_validate_checks_the_manifests_shape_first(bundle_copy, capsys, shape: str):
    folder = bundle_copy()
    _edit(folder / "mobius_manifest.json", SHAPES[shape][0])
    assert main(["validate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err == f"mobius-genai: error: mobius_manifest.json: {SHAPES[shape][1]}\n"


def test_package_replaces_a_folder_whose_json_is_of_another_shape(bundle_copy, capsys):
    folder = bundle_copy()
    (folder / "genai_config.json").write_text("[]")
    (folder / "mobius_manifest.json").write_text('"x"')
    argv = ["package", str(TINY_QWEN2), "-o", str(folder), "--quiet", "--no-smoke-test"]
    assert main(argv) == 1
    assert "folder exists and is not empty" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    assert main(["validate", str(folder)]) == 0
