"""Each EP fact lives in its `EpCapabilities` entry: no module outside mobius_genai/ep/ names a
built-in EP's onnxruntime or onnxruntime-genai provider, or the wheel that runs it, or spells
out the host EP ("cpu") instead of `HOST_EP`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mobius_genai
from mobius_genai.ep import BUILTIN_EPS, HOST_EP

PACKAGE = Path(mobius_genai.__file__).parent
EP_PACKAGE = PACKAGE / "ep"


def _entry_strings() -> set[str]:
    """Provider names and packages of the built-ins that are not also an EP name or the wheel
    every CPU bundle runs with (those appear in prose everywhere: "cuda", "onnxruntime-genai")."""
    names = {caps.name for caps in BUILTIN_EPS}
    stock = {caps.runtime.package for caps in BUILTIN_EPS if caps.runtime.genai_provider is None}
    strings = set()
    for caps in BUILTIN_EPS:
        runtime = caps.runtime
        strings |= {runtime.ort_provider, runtime.genai_provider, runtime.package}
    return {s for s in strings if s is not None} - names - stock


def test_the_strings_checked_are_the_provider_names():
    strings = _entry_strings()
    assert {"CUDAExecutionProvider", "NvTensorRtRtx", "onnxruntime-genai-cuda"} <= strings
    assert "cuda" not in strings


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.rglob("*.py") if EP_PACKAGE not in p.parents),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_module_outside_ep_names_a_builtin_provider(path: Path):
    text = path.read_text(encoding="utf-8")
    named = sorted(s for s in _entry_strings() if s in text)
    assert not named, f"{path.relative_to(PACKAGE)} names {named}: read them from EpCapabilities"


def _host_ep_spelled_out(tree: ast.AST) -> list[int]:
    """Lines where the host EP's name is passed, assigned, returned or compared as a literal."""
    lines = []
    for node in ast.walk(tree):
        values: list[ast.expr | None] = []
        if isinstance(node, ast.Call):
            values = [*node.args, *(keyword.value for keyword in node.keywords)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return)):
            values = [node.value]
        elif isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
        lines += [v.lineno for v in values if isinstance(v, ast.Constant) and v.value == HOST_EP]
    return lines


def test_the_check_for_the_host_ep_sees_a_literal():
    tree = ast.parse(f'get_ep("{HOST_EP}")\nEP = "{HOST_EP}"\nrequest["{HOST_EP}"]')
    assert sorted(_host_ep_spelled_out(tree)) == [1, 2]  # a request's key is no EP


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.rglob("*.py") if EP_PACKAGE not in p.parents),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_module_outside_ep_spells_out_the_host_ep(path: Path):
    lines = _host_ep_spelled_out(ast.parse(path.read_text(encoding="utf-8")))
    assert not lines, f"{path.relative_to(PACKAGE)}:{lines} names {HOST_EP!r}: use HOST_EP"
