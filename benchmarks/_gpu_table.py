"""gpu_check.py's outputs: each line's verdict, gpu_check.json and the markdown table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The table's columns after the line's name: (title, the steps shown in it, first found).
COLUMNS = (
    ("graph", ("graph",)),
    ("logits / features, capture off", ("logits-off", "features")),
    ("logits, capture on", ("logits-on",)),
    ("tokens vs cpu, capture off", ("tokens-off",)),
    ("tokens vs cpu, capture on", ("tokens-on",)),
    ("decode vs builder", ("decode",)),
)
_MARKS = {True: "ok", False: "FAIL", None: "n/a"}


def verdict(result: Mapping[str, Any]) -> str:
    """ "error" (no record), "fail" (a step failed) or "pass" (every step that ran passed)."""
    if "steps" not in result:
        return "error"
    if any(step["ok"] is False for step in result["steps"].values()):
        return "fail"
    return "pass"


def write_outputs(
    out: Path, environment: Mapping[str, Any], results: Sequence[Mapping[str, Any]]
) -> None:
    """gpu_check.json (everything) and gpu_check.md (the table) in `out`."""
    document = {"environment": environment, "lines": list(results)}
    (out / "gpu_check.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(environment, results))


def markdown(environment: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> str:
    """The table, one row per line, and the capability fields the passing lines back."""
    versions = ", ".join(f"{k} {v}" for k, v in environment.get("versions", {}).items())
    where = "dry run on CPU" if environment.get("dry_run") else environment.get("gpu", "GPU")
    lines = [
        f"# GPU check ({where})",
        "",
        f"Python {environment.get('python', '?')}; {versions}.",
        "",
        "| line | checks | " + " | ".join(title for title, _ in COLUMNS) + " | s | verdict |",
        "|---|---|" + "---|" * len(COLUMNS) + "--:|---|",
    ]
    for result in results:
        steps = result.get("steps", {})
        cells = [_cell(steps, names) for _, names in COLUMNS]
        if "steps" not in result:
            cells = [_escape(result.get("error") or result.get("note", ""))] + [""] * (
                len(COLUMNS) - 1
            )
        row = [result["line"], _escape(result.get("checks", "")), *cells]
        row += [str(result.get("seconds", "")), result["status"]]
        lines.append("| " + " | ".join(row) + " |")
    failed = [
        f"- {result['line']}: {name}: {_escape(step['note'])}"
        for result in results
        for name, step in result.get("steps", {}).items()
        if step["ok"] is False and name not in {n for _, names in COLUMNS for n in names}
    ]
    if failed:
        lines += ["", "Other failed steps:", "", *failed]
    lines += ["", "Kernels the passing lines back (see benchmarks/README.md):", ""]
    backed = [
        f"- {result['line']}: cuda `{field}=True`"
        for result in results
        if result["status"] == "pass" and not environment.get("dry_run")
        for field in result.get("flags", {})
    ]
    lines += backed or ["- none"]
    return "\n".join(lines) + "\n"


def _cell(steps: Mapping[str, Any], names: Sequence[str]) -> str:
    step = next((steps[name] for name in names if name in steps), None)
    if step is None:
        return ""
    return f"{_MARKS[step['ok']]}: {_escape(step['note'])}"


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
