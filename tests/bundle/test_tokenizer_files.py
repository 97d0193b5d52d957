"""Tokenizer files enter a bundle only as regular files of the checkpoint (or the blobs of a
huggingface_hub cache snapshot), and a failed copy is one BundleError that leaves nothing."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache

from mobius_genai import packager
from mobius_genai.bundle import tokenizer_files
from mobius_genai.errors import BundleError, ConfigError
from tests.conftest import TINY_QWEN2, hub_snapshot

SECRET = "root:x:0:0:the secret that must not ship\n"


def _leftovers(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir())


def _checkpoint(tmp_path: Path) -> Path:
    return shutil.copytree(TINY_QWEN2, tmp_path / "ckpt")


def _link_outside_absolute(folder: Path, name: str) -> None:
    (folder.parent / "secret").write_text(SECRET)
    (folder / name).symlink_to(folder.parent / "secret")


def _link_outside_relative(folder: Path, name: str) -> None:
    (folder.parent / "secret").write_text(SECRET)
    (folder / name).symlink_to(Path("..") / "secret")


def _link_inside(folder: Path, name: str) -> None:
    (folder / name).symlink_to("vocab.json")


def _fifo(folder: Path, name: str) -> None:
    os.mkfifo(folder / name)  # copying it would wait for a writer forever


def _folder(folder: Path, name: str) -> None:
    (folder / name).mkdir()


NOT_REGULAR = {
    "link outside (absolute)": (_link_outside_absolute, "is a symbolic link"),
    "link outside (relative)": (_link_outside_relative, "is a symbolic link"),
    "named pipe": (_fifo, "not a regular file"),
    "folder": (_folder, "not a regular file"),
}


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_only_regular_files_are_copied(tmp_path: Path, kind: str):
    source = _checkpoint(tmp_path)
    make, words = NOT_REGULAR[kind]
    (source / "special_tokens_map.json").unlink()
    make(source, "special_tokens_map.json")
    (tmp_path / "bundle").mkdir()
    with pytest.raises(BundleError, match=f"special_tokens_map.json: {words}") as caught:
        tokenizer_files.copy_tokenizer_files(source, tmp_path / "bundle")
    assert "accepted: regular files" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert "special_tokens_map.json" not in _leftovers(tmp_path / "bundle")


def test_package_refuses_a_symlinked_tokenizer_file_and_writes_nothing(tmp_path: Path):
    source = _checkpoint(tmp_path)
    (source / "special_tokens_map.json").unlink()
    _link_outside_absolute(source, "special_tokens_map.json")
    with pytest.raises(ConfigError, match="special_tokens_map.json: is a symbolic link to"):
        packager.package(source, "cpu", tmp_path / "out", quiet=True, smoke_test=False)
    assert _leftovers(tmp_path) == ["ckpt", "secret"]


def test_a_link_to_a_file_of_the_checkpoint_is_copied_as_that_file(tmp_path: Path):
    source = _checkpoint(tmp_path)
    (source / "special_tokens_map.json").unlink()
    _link_inside(source, "special_tokens_map.json")
    (tmp_path / "bundle").mkdir()
    assert "special_tokens_map.json" in tokenizer_files.copy_tokenizer_files(
        source, tmp_path / "bundle"
    )
    copied = tmp_path / "bundle" / "special_tokens_map.json"
    assert not copied.is_symlink() and copied.read_bytes() == (source / "vocab.json").read_bytes()


def test_hub_cache_snapshot_files_are_copied_as_files(tmp_path: Path):
    snapshot = hub_snapshot(tmp_path / "hub")
    assert os.readlink(snapshot / "tokenizer.json").startswith("../../blobs/")
    # huggingface_hub itself finds the files in this cache
    found = try_to_load_from_cache("org/tiny", "tokenizer.json", cache_dir=tmp_path / "hub")
    assert Path(found) == snapshot / "tokenizer.json"
    out = tmp_path / "bundle"
    out.mkdir()
    copied = tokenizer_files.copy_tokenizer_files(snapshot, out)
    assert "tokenizer.json" in copied and "special_tokens_map.json" in copied
    for name in copied:
        assert not (out / name).is_symlink()
        assert (out / name).read_bytes() == (TINY_QWEN2 / name).read_bytes()


@pytest.mark.parametrize("target", ["other repo's blob", "blob linking outside", "outside"])
def test_hub_cache_links_must_stay_in_their_repos_blobs(tmp_path: Path, target: str):
    snapshot = hub_snapshot(tmp_path / "hub")
    other = hub_snapshot(tmp_path / "hub", "models--other--repo")
    (tmp_path / "secret").write_text(SECRET)
    link = snapshot / "special_tokens_map.json"
    blob = link.resolve()
    if target == "other repo's blob":
        other_blob = (other / "special_tokens_map.json").resolve()
        link.unlink()
        link.symlink_to(Path("../../..") / other.parents[1].name / "blobs" / other_blob.name)
    elif target == "blob linking outside":
        blob.unlink()
        blob.symlink_to(tmp_path / "secret")
    else:
        link.unlink()
        link.symlink_to(Path("../../../..") / "secret")
    (tmp_path / "bundle").mkdir()
    with pytest.raises(BundleError, match="special_tokens_map.json: is a symbolic link to"):
        tokenizer_files.copy_tokenizer_files(snapshot, tmp_path / "bundle")


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["writing", "creating"])
def test_a_full_disk_while_copying_is_a_bundle_error_that_keeps_the_old_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, packaged
):
    """Full disk (ENOSPC while writing) and no inodes left (ENOSPC while creating the file)."""
    out = shutil.copytree(packaged("cpu"), tmp_path / "b")  # the bundle a failed force keeps
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    if where == "writing":
        monkeypatch.setattr(tokenizer_files.shutil, "copyfileobj", _disk_full)
    else:
        real_open = os.open

        def no_inodes(path, flags, *args, **kwargs):
            if Path(path).name == "tokenizer.json" and flags & os.O_CREAT:
                _disk_full()
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(tokenizer_files.os, "open", no_inodes)
    with pytest.raises(BundleError) as caught:
        packager.package(TINY_QWEN2, "cpu", out, quiet=True, smoke_test=False, force=True)
    message = str(caught.value)
    assert message.startswith("tokenizer.json: cannot copy it into the bundle (No space left")
    assert "\n" not in message
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert _leftovers(tmp_path) == ["b"]


@pytest.mark.parametrize("file", ["tokenizer.json", "tokenizer_config.json"])
def test_package_refuses_added_tokens_outside_the_vocabulary_before_saving_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file: str
):
    source = _checkpoint(tmp_path)
    document = json.loads((source / file).read_text())
    if file == "tokenizer.json":
        document["added_tokens"].append({"id": 400, "content": "<|extra|>", "special": True})
    else:
        document["added_tokens_decoder"]["400"] = {"content": "<|extra|>", "special": True}
    (source / file).write_text(json.dumps(document))
    monkeypatch.setattr(packager, "save_with_digest", lambda *a, **k: pytest.fail("saved"))
    with pytest.raises(BundleError) as caught:
        packager.package(source, "cpu", tmp_path / "out", quiet=True, smoke_test=False)
    assert str(caught.value) == (
        f"{file}: added token '<|extra|>': [400] outside the vocabulary [0, 384) of config.json's "
        "vocab_size; the checkpoint's config.json and its tokenizer disagree"
    )
    assert _leftovers(tmp_path) == ["ckpt"]
