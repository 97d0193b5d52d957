"""Fixtures for the Olive tests: the package config, recipes pointed at the tiny model, `olive run`."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mobius_genai.cli import main
from tests.conftest import TINY_QWEN2

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
RECIPE_NAMES = ("cpu-int4", "cpu-fp32", "cuda-fp16", "webgpu-int4")

#: Offline, and no telemetry: Olive's CLI sends a heartbeat unless it sees a CI variable, and
#: without network that costs ~10 s per run (OLIVE_DISABLE_TELEMETRY is read after the beat).
OLIVE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CI": "1"}


def load_recipe(name: str) -> dict[str, Any]:
    return json.loads((RECIPES / f"{name}.json").read_text(encoding="utf-8"))


def local_recipe(name: str, workdir: Path, model: Path = TINY_QWEN2) -> dict[str, Any]:
    """Recipe `name` as a user runs it: input model replaced, output and cache under `workdir`."""
    recipe = load_recipe(name)
    recipe["input_model"]["model_path"] = str(model)
    recipe["output_dir"] = str(workdir / "out")
    recipe["cache_dir"] = str(workdir / "cache")
    return recipe


def export_tiny(
    workdir: Path, config: dict[str, Any], ep: str | None = "CPUExecutionProvider", **model: Any
):
    """Run MobiusExport on the tiny model (HfModel options `model`) as Olive would, for an
    accelerator with `ep`."""
    from olive.hardware.accelerator import AcceleratorSpec
    from olive.model import HfModelHandler
    from olive.passes.olive_pass import create_pass_from_dict

    from mobius_genai.olive import MobiusExport

    device = "cpu" if ep in (None, "CPUExecutionProvider") else "gpu"
    accelerator = AcceleratorSpec(accelerator_type=device, execution_provider=ep)
    export = create_pass_from_dict(MobiusExport, {"smoke_test": False, **config}, True, accelerator)
    handler = HfModelHandler(model_path=str(TINY_QWEN2), **model)
    return export.run(handler, str(workdir / "export"))


@pytest.fixture(scope="session")
def package_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package config as users make it: `mobius-genai olive-config -o FILE`."""
    path = tmp_path_factory.mktemp("olive") / "mobius-olive.json"
    assert main(["olive-config", "-o", str(path)]) == 0
    return path


@pytest.fixture
def olive_workflow(
    package_config: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[dict[str, Any]], Path]:
    """Run a recipe in this process with `olive.workflows.run` (what `olive run` calls, ~6 s
    faster than a subprocess); returns output_dir."""
    from olive.workflows import run

    for key, value in OLIVE_ENV.items():
        monkeypatch.setenv(key, value)

    def run_recipe(recipe: dict[str, Any]) -> Path:
        out = Path(recipe["output_dir"])
        run(copy.deepcopy(recipe), package_config=str(package_config))
        return out

    return run_recipe


@pytest.fixture
def olive_run(package_config: Path, tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Run `olive run --config RECIPE --package-config FILE` in a subprocess; returns output_dir."""

    def run(recipe: dict[str, Any]) -> Path:
        config = tmp_path / "recipe.json"
        config.write_text(json.dumps(recipe, indent=2), encoding="utf-8")
        command = [sys.executable, "-m", "olive", "run", "--config", str(config)]
        command += ["--package-config", str(package_config)]
        result = subprocess.run(
            command,
            cwd=tmp_path,
            env={**os.environ, **OLIVE_ENV},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, f"olive run failed:\n{result.stdout}\n{result.stderr}"
        return Path(recipe["output_dir"])

    return run
