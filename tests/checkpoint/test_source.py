"""Source resolution: local folders as they are; hub ids through huggingface_hub's cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import scan_cache_dir, try_to_load_from_cache

import mobius_genai
from mobius_genai import ConfigError
from mobius_genai.checkpoint.opening import stored_bits
from mobius_genai.checkpoint.source import HUB_FILE_PATTERNS, resolve_source
from tests._hf import hub_cache, write_tiny_checkpoint
from tests.conftest import TINY_QWEN2


def _offline_cache(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))


def test_local_folder_is_used_in_place():
    source = resolve_source(TINY_QWEN2)
    assert source.path == TINY_QWEN2.resolve()
    assert source.model_id == TINY_QWEN2.name  # never the local path


def test_hub_id_resolves_from_the_cache_when_offline(tmp_path, monkeypatch):
    _offline_cache(monkeypatch, tmp_path)
    snapshot = hub_cache(tmp_path, "tiny-org/tiny-qwen2", TINY_QWEN2)
    source = resolve_source("tiny-org/tiny-qwen2")
    assert source.path.resolve() == snapshot.resolve()
    assert source.model_id == "tiny-org/tiny-qwen2"
    package = mobius_genai.build("tiny-org/tiny-qwen2")
    assert package.source.model_id == "tiny-org/tiny-qwen2"
    assert stored_bits("tiny-org/tiny-qwen2") == frozenset()  # config.json from the cache


def test_a_sharded_hub_checkpoint_builds_from_the_cache(tmp_path, monkeypatch):
    """The README's example models are sharded: their shards in the cache are symlinks into
    blobs/, outside the snapshot folder, and must be read all the same."""
    sharded = write_tiny_checkpoint(tmp_path / "sharded", "qwen2", max_shard_size="50KB")
    single = write_tiny_checkpoint(tmp_path / "single", "qwen2")
    _offline_cache(monkeypatch, tmp_path / "cache")
    snapshot = hub_cache(tmp_path / "cache", "tiny-org/sharded", sharded)
    [repo] = scan_cache_dir(tmp_path / "cache").repos
    [revision] = repo.revisions
    shards = [f for f in revision.files if f.file_name.endswith(".safetensors")]
    assert len(shards) > 2
    assert all(f.blob_path.parent.name == "blobs" != f.file_path.parent.name for f in shards)
    index = try_to_load_from_cache("tiny-org/sharded", "model.safetensors.index.json")
    assert Path(index).is_symlink() and Path(index).parent == snapshot

    from_cache = mobius_genai.build("tiny-org/sharded")
    from_single = mobius_genai.build(single)
    assert from_cache.source.path == snapshot
    expected = from_single["model"].graph.initializers
    got = from_cache["model"].graph.initializers
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        if value.const_value is not None:
            np.testing.assert_array_equal(got[name].const_value.numpy(), value.const_value.numpy())


def test_hub_id_missing_offline_is_a_clear_error(tmp_path, monkeypatch):
    _offline_cache(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match=r"'nobody/nothing': not in the local cache"):
        resolve_source("nobody/nothing")
    with pytest.raises(ConfigError, match=r"'nobody/nothing': not in the local cache"):
        stored_bits("nobody/nothing")


def test_only_safe_files_are_requested_from_the_hub():
    assert "*.safetensors" in HUB_FILE_PATTERNS
    assert not any(p.endswith((".bin", ".py", ".pt", ".pth", ".pkl")) for p in HUB_FILE_PATTERNS)
    assert "*" not in HUB_FILE_PATTERNS


def test_download_asks_only_for_the_bundle_files(monkeypatch, tmp_path):
    seen = {}

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None):
        seen.update(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns)
        return str(TINY_QWEN2)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    source = resolve_source("org/model", revision="v1")
    assert seen == {
        "repo_id": "org/model",
        "revision": "v1",
        "allow_patterns": list(HUB_FILE_PATTERNS),
    }
    assert (source.model_id, source.revision) == ("org/model", "v1")


@pytest.mark.parametrize("progress", [True, False])
def test_quiet_builds_silence_the_hub_download_bars(monkeypatch, tmp_path, progress: bool):
    from huggingface_hub import constants
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", None)
    was_disabled = are_progress_bars_disabled()  # other tests' libraries may have turned them off
    enable_progress_bars()
    seen = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None):
        seen.append(are_progress_bars_disabled())
        return str(TINY_QWEN2)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    try:
        mobius_genai.build("org/model", load_weights=False, progress=progress)
        assert seen == [not progress]
        assert not are_progress_bars_disabled()  # restored afterwards
    finally:
        if was_disabled:
            disable_progress_bars()


def test_a_file_is_named_as_a_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"config.json': is a file; accepted: a .gguf file, a"):
        resolve_source(tmp_path / "config.json")
