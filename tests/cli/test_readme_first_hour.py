"""What the README tells a new user next to the first commands holds."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
README = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())


def test_the_first_command_warns_that_the_tiny_model_prints_gibberish():
    first_block_end = README.index("```", README.index("```bash") + 3)
    after = README[first_block_end : first_block_end + 400]
    assert "random weights" in after and "gibberish" in after


def test_the_olive_extra_leaves_torch_to_olive_ai_and_the_readme_says_how_to_keep_it_cpu():
    pytest.importorskip("olive")
    ours = [Requirement(line) for line in importlib.metadata.requires("mobius-genai") or []]
    extra = {r.name for r in ours if r.marker is not None and r.marker.evaluate({"extra": "olive"})}
    assert "olive-ai" in extra and "torch" not in extra  # nothing of ours to trim
    olive = importlib.metadata.requires("olive-ai") or []
    assert "torch" in {Requirement(line).name for line in olive if "extra ==" not in line}
    assert re.search(
        r"pip install torch --index-url https://download\.pytorch\.org/whl/cpu", README
    )


def test_the_test_command_says_how_long_it_takes():
    command = README.index("python -m pytest -q")
    before = README[README.rindex("Install what the tests need", 0, command) : command]
    assert re.search(r"about \d+ minutes on \d+ cores, installs included", before)
