"""No module that orchestrates (build, the packager, bundle/, runtime/, cli/, ...) names the
vision-language kind or its rows: they ask the kind (`kinds/`) or og's type row
(`kinds/og_types.py`). The kind's own building blocks (models/, config/, components/, tasks/)
and kinds/ may; a tower's config is never told apart by isinstance anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import mobius_genai

#: Names that tell a vision-language model from others (the old branches and tables).
KIND_NAMES = frozenset(
    {
        "vision_language",
        "vision_language_family",
        "VISION_LANGUAGE",
        "VisionLanguageFamily",
        "VisionLanguageConfig",
        "VisionLanguageKind",
        "QwenVisionConfig",
        "IMAGE_PLACEHOLDERS",
        "THREE_D_POSITIONS",
        "add_vision_language",
        "processor_config",
    }
)
#: Where a kind's own code lives (top-level folders of the package).
KIND_ROOMS = frozenset({"kinds", "models", "config", "components", "tasks"})
TOWER_CONFIGS = frozenset({"VisionConfig", "QwenVisionConfig"})


def _names(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
    return found


def _isinstance_of(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            found |= _names(node.args[1]) & TOWER_CONFIGS
    return found


def kind_branches(root: Path) -> dict[str, list[str]]:
    """Module (relative to `root`) → what it names of the vision-language kind, or tests
    with isinstance; only modules outside the kind's rooms are read for names."""
    problems = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = sorted(_isinstance_of(tree))
        if relative.parts[0] not in KIND_ROOMS:
            found += sorted(_names(tree) & KIND_NAMES)
        if found:
            problems[str(relative)] = found
    return problems


def test_no_module_outside_the_kinds_names_the_vision_language_kind():
    assert kind_branches(Path(mobius_genai.__file__).parent) == {}


def test_no_benchmark_names_the_vision_language_kind():
    assert kind_branches(Path(__file__).parents[2] / "benchmarks") == {}


def test_the_check_finds_a_branch(tmp_path):
    """The scan sees the forms the old code took (a lookup, an attribute, an isinstance)."""
    (tmp_path / "packager.py").write_text(
        "if built.vision_language is not None:\n    add_vision_language(config, built)\n"
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "rows.py").write_text(
        "VISION_LANGUAGE = {}\nok = isinstance(vision, QwenVisionConfig)\n"
    )
    assert kind_branches(tmp_path) == {
        "models/rows.py": ["QwenVisionConfig"],
        "packager.py": ["add_vision_language", "vision_language"],
    }
