"""The package uses only the public API of its dependencies, within tested bounds."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mobius_genai",)
DEPENDENCIES = ("onnxscript", "onnx_ir", "onnx", "onnxruntime")
# The dependencies whose private API changes between minor releases; pinned to the tested line.
BOUNDED = ("onnxscript", "onnx-ir")
#: Underscored names the standard library documents as public: `os._exit` ends a process
#: without running cleanup (a signal that arrives while the interpreter shuts down).
DOCUMENTED = {("os", "_exit")}


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_uses(path: Path) -> list[str]:
    """Private modules, names and attributes of the dependencies that `path` reaches for."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            parts = [part for alias in node.names for part in alias.name.split(".")]
            names = []
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            owner_name = owner.id if isinstance(owner, ast.Name) else None
            if owner_name not in ("self", "cls") and (owner_name, node.attr) not in DOCUMENTED:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
            continue
        else:
            continue
        if parts[0] in DEPENDENCIES and any(_private(p) for p in parts[1:] + names):
            found.append(f"{path.name}:{node.lineno} {'.'.join(parts)} {names}")
    return found


def test_only_public_modules_names_and_attributes_of_dependencies():
    assert [use for path in _sources() for use in _private_uses(path)] == []


def _requirements() -> dict[str, Requirement]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["dependencies"]]
    return {requirement.name: requirement for requirement in requirements}


@pytest.mark.parametrize("name", BOUNDED)
def test_bounds_admit_exactly_the_tested_minor_line(name):
    specifier = _requirements()[name].specifier
    lower = [Version(s.version) for s in specifier if s.operator == ">="]
    upper = [Version(s.version) for s in specifier if s.operator == "<"]
    assert len(lower) == 1 and len(upper) == 1, f"{name}: {specifier}"
    (low,), (high,) = lower, upper
    assert high == Version(f"{low.major}.{low.minor + 1}"), f"{name}: {specifier}"
    installed = importlib.metadata.version(name)
    assert specifier.contains(installed), f"{name} {installed} outside {specifier}"
