"""The external data file's sha256, computed while it is written, is the file's own."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai.bundle import manifest
from mobius_genai.bundle.digest import save_with_digest
from mobius_genai.bundle.packager import package
from tests.bundle.conftest import TINY_QWEN2


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_manifest_hash_of_the_data_file_is_computed_while_writing(
    precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    hashed_files: list[str] = []
    original = manifest._sha256
    monkeypatch.setattr(
        manifest, "_sha256", lambda path: hashed_files.append(Path(path).name) or original(path)
    )
    out = package(TINY_QWEN2, "cpu", tmp_path / "b", precision=precision, quiet=True)
    assert "model.onnx.data" not in hashed_files  # taken from the save, not read again
    assert "model.onnx" in hashed_files
    entry = json.loads((out / "mobius_manifest.json").read_text())["files"]["model.onnx.data"]
    assert entry["sha256"] == original(out / "model.onnx.data")
    assert entry["size"] == (out / "model.onnx.data").stat().st_size


def test_a_gap_in_the_file_means_no_remembered_hash(tmp_path: Path, monkeypatch):
    """Aligned offsets leave gaps the hasher does not see: the file is hashed instead."""
    built = mobius_genai.build(TINY_QWEN2, "cpu", "f32")
    save = ir.save
    monkeypatch.setattr(
        ir, "save", lambda *a, **k: save(*a, **k, alignment=65536, align_threshold=0)
    )
    remembered: list[Path] = []
    digest = importlib.import_module("mobius_genai.bundle.digest")
    monkeypatch.setattr(digest, "remember_sha256", lambda path, _: remembered.append(path))
    save_with_digest(built, tmp_path, progress=False)
    assert (tmp_path / "model.onnx.data").is_file()
    assert remembered == []
    # The model's tensors are its own again after the save.
    assert not any(
        type(v.const_value).__name__ == "_HashedTensor"
        for v in built["model"].graph.initializers.values()
    )
