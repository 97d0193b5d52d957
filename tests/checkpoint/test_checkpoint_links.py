"""A checkpoint file that is a symbolic link leading out of the checkpoint (its folder, or for a
huggingface_hub cache snapshot the model's cache entry) is refused in one line when the source
is resolved, before any graph is built; links that stay inside it (the cache's links into
blobs/) are read as the files they name."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest

import mobius_genai
from mobius_genai.checkpoint.source import classify
from mobius_genai.cli import main
from mobius_genai.errors import ConfigError, WeightsError
from tests._hf import write_tiny_checkpoint
from tests.conftest import TINY_QWEN2, hub_snapshot


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint in shards with model.safetensors.index.json."""
    folder = tmp_path_factory.mktemp("sharded") / "ckpt"
    write_tiny_checkpoint(folder, "qwen2", max_shard_size="50KB", vocab_size=384)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copyfile(TINY_QWEN2 / name, folder / name)
    return folder


@pytest.fixture
def no_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a graph fails the test: a refusal must come before it."""

    def built(*args, **kwargs):
        pytest.fail("the graph was built")

    monkeypatch.setattr(importlib.import_module("mobius_genai.build"), "CausalLMModel", built)


def _move_out(folder: Path, name: str) -> Path:
    """Replace `folder/name` by a link to the same file moved outside the folder."""
    outside = folder.parent / "elsewhere" / name
    outside.parent.mkdir(exist_ok=True)
    shutil.move(folder / name, outside)
    (folder / name).symlink_to(outside)
    return outside


def _shard(folder: Path) -> str:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))[-1]


@pytest.mark.parametrize(
    "name",
    ["config.json", "tokenizer.json", "special_tokens_map.json", "generation_config.json"],
)
def test_a_file_linked_out_of_the_folder_is_refused_before_the_graph(
    tmp_path: Path, no_graph: None, name: str
):
    folder = shutil.copytree(TINY_QWEN2, tmp_path / "ckpt")
    outside = _move_out(folder, name)
    with pytest.raises(ConfigError) as caught:
        mobius_genai.package(folder, "cpu", tmp_path / "out", quiet=True, smoke_test=False)
    assert str(caught.value).startswith(
        f"{name}: is a symbolic link to {outside}, out of the checkpoint folder "
        f"{folder.resolve()}; accepted: regular files in the checkpoint folder, or links that "
        "stay inside it"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["a shard", "the index"])
def test_a_shard_or_index_linked_out_of_the_folder_is_refused(
    tmp_path: Path, sharded: Path, no_graph: None, which: str
):
    folder = shutil.copytree(sharded, tmp_path / "ckpt")
    name = _shard(folder) if which == "a shard" else "model.safetensors.index.json"
    _move_out(folder, name)
    with pytest.raises(ConfigError, match=rf"^{name}: is a symbolic link to .*elsewhere"):
        mobius_genai.build(folder)


def test_a_shard_in_a_linked_subfolder_is_refused(tmp_path: Path, sharded: Path, no_graph: None):
    folder = shutil.copytree(sharded, tmp_path / "ckpt")
    shard = _shard(folder)
    (tmp_path / "elsewhere").mkdir()
    shutil.move(folder / shard, tmp_path / "elsewhere" / shard)
    (folder / "sub").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    index = folder / "model.safetensors.index.json"
    document = json.loads(index.read_text())
    document["weight_map"] = {
        key: f"sub/{value}" if value == shard else value
        for key, value in document["weight_map"].items()
    }
    index.write_text(json.dumps(document))
    with pytest.raises(WeightsError, match=rf"^sub/{shard}: leads through a symbolic link to "):
        mobius_genai.build(folder)


def test_links_inside_the_folder_are_read(tmp_path: Path, sharded: Path):
    folder = shutil.copytree(sharded, tmp_path / "ckpt")
    (folder / "weights").mkdir()
    shard = _shard(folder)
    shutil.move(folder / shard, folder / "weights" / shard)
    (folder / shard).symlink_to(Path("weights") / shard)
    (folder / "tokenizer.json").rename(folder / "weights" / "tokenizer.json")
    (folder / "tokenizer.json").symlink_to(folder / "weights" / "tokenizer.json")
    out = mobius_genai.package(folder, "cpu", tmp_path / "out", quiet=True, smoke_test=False)
    copied = out / "tokenizer.json"
    assert (
        not copied.is_symlink()
        and copied.read_bytes() == (TINY_QWEN2 / "tokenizer.json").read_bytes()
    )


@pytest.mark.parametrize("target", ["another model's blob", "outside the cache"])
def test_a_hub_snapshot_link_leaving_its_cache_entry_is_refused(
    tmp_path: Path, sharded: Path, no_graph: None, capsys, target: str
):
    snapshot = hub_snapshot(tmp_path / "hub", files=sharded)
    other = hub_snapshot(tmp_path / "hub", "models--other--model")
    shard = snapshot / _shard(sharded)
    shard.unlink()
    if target == "another model's blob":
        shard.symlink_to((other / "model.safetensors").resolve())
    else:
        (tmp_path / "secret.safetensors").write_bytes((sharded / _shard(sharded)).read_bytes())
        shard.symlink_to(Path("../../../../..") / "secret.safetensors")
    assert main(["package", str(snapshot), "-o", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"mobius-genai: error: {shard.name}: is a symbolic link to ")
    assert (
        f"out of the model's huggingface_hub cache entry {tmp_path / 'hub' / 'models--org--tiny'}"
        in err
    )


def test_a_hub_snapshot_of_links_into_its_blobs_builds(tmp_path: Path, sharded: Path):
    snapshot = hub_snapshot(tmp_path / "hub", files=sharded)
    assert mobius_genai.build(snapshot, load_weights=True).source.path == snapshot.resolve()


def test_a_gguf_file_linked_out_of_its_folder_is_refused(tmp_path: Path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "folder").mkdir()
    link = tmp_path / "folder" / "model.gguf"
    link.symlink_to(tmp_path / "elsewhere" / "model.gguf")
    for named in (link, link.parent):
        with pytest.raises(ConfigError, match=r"^model.gguf: is a symbolic link to .*elsewhere"):
            classify(named)
    snapshot = hub_snapshot(tmp_path / "hub", files=tmp_path / "elsewhere")
    assert classify(snapshot / "model.gguf").path.parent.name == "blobs"
