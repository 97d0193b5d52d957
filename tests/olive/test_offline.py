"""Olive offline, with the model in the local HuggingFace cache (a fake cache made in tmp; no
network): Olive looks a hub id up online before any pass runs, so the README gives it the
cached snapshot folder; the bundle still records the hub id and the snapshot's commit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub.errors import OfflineModeIsEnabled

from tests._hf import HUB_COMMIT, hub_cache
from tests.olive.conftest import ROOT, TINY_QWEN2, local_recipe

HUB_ID = "tiny-org/tiny-qwen2"


def _readme_snapshot_command() -> str:
    """The README's `-m "$(...)"` command, for this test's hub id."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r'-m "\$\((HF_HUB_OFFLINE=1 hf download (\S+) --quiet)\)"', readme)
    assert match, "the README shows how to run Olive offline on a cached model"
    return match.group(1).replace(match.group(2), HUB_ID)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny model cached as huggingface_hub caches a download; offline, here and in children."""
    cache = tmp_path / "hub"
    hub_cache(cache, HUB_ID, TINY_QWEN2)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return cache


def _recipe(tmp_path: Path, model: str) -> dict:
    recipe = local_recipe("cpu-fp32", tmp_path)
    recipe["input_model"]["model_path"] = model
    recipe["passes"]["export"]["smoke_test"] = False
    return recipe


def test_the_readme_command_runs_olive_on_the_cached_snapshot(
    tmp_path, offline_cache, olive_workflow
):
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-c", _readme_snapshot_command()],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    snapshot = Path(done.stdout.strip())
    assert snapshot == offline_cache / "models--tiny-org--tiny-qwen2" / "snapshots" / HUB_COMMIT
    out = olive_workflow(_recipe(tmp_path, str(snapshot)))
    source = json.loads((out / "mobius_manifest.json").read_text())["source"]
    assert (source["model_id"], source["revision"]) == (HUB_ID, HUB_COMMIT)


def test_a_hub_id_stops_olive_offline_before_any_pass(tmp_path, offline_cache, olive_workflow):
    """What the README warns of: Olive's own lookup, before MobiusExport runs."""
    with pytest.raises(OfflineModeIsEnabled):
        olive_workflow(_recipe(tmp_path, HUB_ID))
    assert not list(tmp_path.rglob("model.onnx"))  # MobiusExport never ran
