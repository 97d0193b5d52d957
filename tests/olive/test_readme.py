"""recipes/README.md agrees with the code: every option, EP mapping row and recipe it lists."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("olive", reason="the olive extra is not installed: pip install -e '.[olive]'")

from olive.hardware.accelerator import DEFAULT_CPU_ACCELERATOR

from mobius_genai.olive import MobiusExport, olive_ep_mapping
from mobius_genai.quantize import DEFAULT_QUALITY, QUALITIES
from tests.olive.conftest import RECIPE_NAMES, RECIPES

README = (RECIPES / "README.md").read_text(encoding="utf-8")


def _first_cells() -> list[str]:
    return re.findall(r"^\| `?([^|`]+?)`? \|", README, flags=re.MULTILINE)


def test_the_options_table_lists_every_mobius_export_option():
    options = set(MobiusExport.default_config(DEFAULT_CPU_ACCELERATOR))
    listed = {cell for cell in _first_cells() if re.fullmatch(r"[a-z0-9_]+", cell)}
    assert listed == options


def test_the_ep_table_is_the_mapping():
    rows = dict(re.findall(r"^\| (\w+ExecutionProvider) \| ([\w-]+) \|$", README, re.MULTILINE))
    assert rows == olive_ep_mapping()


def test_the_recipe_table_lists_every_recipe():
    listed = {cell.removesuffix(".json") for cell in _first_cells() if cell.endswith(".json")}
    assert listed == set(RECIPE_NAMES) == {path.stem for path in RECIPES.glob("*.json")}


def test_the_int4_quality_row_names_every_recipe_and_the_default():
    row = re.search(r"^\| `int4_quality` \| (\w[\w-]*) \| (.*) \|$", README, re.MULTILINE)
    assert row is not None and row.group(1) == DEFAULT_QUALITY
    assert set(re.findall(r"`([\w-]+)`", row.group(2))) >= set(QUALITIES)
