"""The README's table of onnxruntime-genai builder `--extra_options` names every option the
installed builder documents, and only those, and the flags it maps them to exist."""

from __future__ import annotations

import ast
import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

from mobius_genai.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: An option's line in the builder's help: `    name = what it does` (after dedent).
_OPTION = re.compile(r"^    (\w+) = ", re.MULTILINE)


def _builder_extra_options_help() -> str:
    """The installed builder's `--extra_options` help text, read from its argparse call
    (running the builder would import torch and transformers and parse our argv)."""
    spec = importlib.util.find_spec("onnxruntime_genai")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "models" / "builder.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and [getattr(arg, "value", None) for arg in node.args] == ["--extra_options"]
        ):
            help_text = next(k.value for k in node.keywords if k.arg == "help")
            if isinstance(help_text, ast.Call):  # textwrap.dedent("""...""")
                help_text = help_text.args[0]
            return textwrap.dedent(ast.literal_eval(help_text))
    pytest.fail("onnxruntime_genai/models/builder.py has no --extra_options argument")


def _readme_table() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("| builder `--extra_options` |")
    end = readme.index("\n\n", start)
    return readme[start:end].splitlines()[2:]


def test_the_table_names_every_builder_extra_option_and_no_other():
    documented = set(_OPTION.findall(_builder_extra_options_help()))
    assert len(documented) > 40  # the parse found the options, not a stray line
    named = {name for row in _readme_table() for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert sorted(documented - named) == [], "builder options missing from the README table"
    assert sorted(named - documented) == [], "README rows for options the builder lacks"


def test_the_flags_the_table_maps_to_exist(capsys):
    with pytest.raises(SystemExit):
        main(["package", "--help"])
    package_help = capsys.readouterr().out
    flags = {flag for row in _readme_table() for flag in re.findall(r"--[\w-]+", row.split("|")[2])}
    assert flags and all(flag in package_help for flag in flags), flags
