"""A bundle names its source by hub id or folder name, never by a path of the machine that
made it (a published bundle must not leak a private path)."""

from __future__ import annotations

import json
import shutil

from mobius_genai.cli import main
from tests.conftest import TINY_QWEN2


def test_no_absolute_path_in_any_file_of_the_bundle(tmp_path, capsys):
    checkpoint = shutil.copytree(TINY_QWEN2, tmp_path / "private" / "my-model")
    out = tmp_path / "out"
    assert main(["package", str(checkpoint), "-o", str(out), "--ep", "cpu", "--quiet"]) == 0
    capsys.readouterr()
    for path in out.rglob("*"):
        assert str(tmp_path).encode() not in path.read_bytes(), path.name
    manifest = json.loads((out / "mobius_manifest.json").read_text())
    assert manifest["source"]["model_id"] == "my-model"
    assert "config.json" in manifest["source"]["files"]  # the source hashes identify it
    assert "`my-model`" in (out / "README.md").read_text()


def test_a_hub_cache_snapshot_folder_is_named_by_its_hub_id(tmp_path, capsys):
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--Org--Tiny-Model" / "snapshots" / commit
    shutil.copytree(TINY_QWEN2, snapshot)
    out = tmp_path / "out"
    args = ["package", str(snapshot), "-o", str(out), "--quiet", "--no-smoke-test"]
    assert main(args) == 0
    capsys.readouterr()
    source = json.loads((out / "mobius_manifest.json").read_text())["source"]
    assert (source["model_id"], source["revision"]) == ("Org/Tiny-Model", commit)
