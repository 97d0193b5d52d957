"""checkpoint/ is the bottom of the data flow: it imports no room above it, and its modules
import one another without a circle (type-only imports counted: they are arrows too)."""

from __future__ import annotations

import ast
from pathlib import Path

import mobius_genai.checkpoint as checkpoint_package

PACKAGE = Path(checkpoint_package.__file__).parent
#: What checkpoint/ may import of mobius_genai: itself and the small shared modules.
ALLOWED = {"checkpoint", "errors", "_json", "_buffers"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The mobius_genai modules `path` imports anywhere (functions, TYPE_CHECKING blocks)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:  # `from package import module` names the module
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "mobius_genai"}


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def test_checkpoint_imports_nothing_above_it():
    above = {
        f"{module} imports {name}"
        for module, names in _graph().items()
        for name in names
        if name.split(".")[1] not in ALLOWED
    }
    assert above == set()


def test_no_circle_among_checkpoint_modules():
    graph = _graph()
    circles = []

    def visit(module: str, path: list[str]) -> None:
        for name in sorted(graph.get(module, ())):
            if name in path:
                circles.append(" → ".join([*path[path.index(name) :], name]))
            elif name in graph and name not in done:
                visit(name, [*path, name])
        done.add(module)

    done: set[str] = set()
    for module in graph:
        if module not in done:
            visit(module, [module])
    assert circles == []
