"""Safe writes: OUT appears only when complete; failures and Ctrl-C leave nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mobius_genai import packager
from mobius_genai.bundle.output_folder import staged_output
from mobius_genai.bundle.tokenizer_files import TOKENIZER_FILES, copy_tokenizer_files
from mobius_genai.errors import BundleError
from tests.conftest import TINY_QWEN2


def _leftovers(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir())


def test_success_renames_the_staging_folder(tmp_path: Path):
    out = tmp_path / "bundle"
    with staged_output(out) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".bundle.")
        (staging / "model.onnx").write_text("graph")
    assert (out / "model.onnx").read_text() == "graph"
    assert _leftovers(tmp_path) == ["bundle"]


@pytest.mark.parametrize("interruption", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failure_leaves_no_output_and_no_staging(tmp_path: Path, interruption: BaseException):
    out = tmp_path / "new" / "deeper" / "bundle"
    with pytest.raises(type(interruption)), staged_output(out) as staging:
        (staging / "model.onnx").write_text("half written")
        raise interruption
    assert _leftovers(tmp_path) == []  # the parents it created are gone too


def test_non_empty_output_is_refused_without_force(tmp_path: Path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(BundleError, match="not empty.*force=True") as raised, staged_output(out):
        pytest.fail("the block must not run")
    assert "--force" not in str(raised.value)  # from Python, the keyword
    assert (out / "keep.txt").read_text() == "precious"
    assert _leftovers(tmp_path) == ["bundle"]


def test_empty_output_folder_is_fine(tmp_path: Path):
    out = tmp_path / "bundle"
    out.mkdir()
    with staged_output(out) as staging:
        (staging / "a").write_text("a")
    assert _leftovers(out) == ["a"]


def test_output_that_is_a_file_is_refused(tmp_path: Path):
    (tmp_path / "bundle").write_text("x")
    with pytest.raises(BundleError, match="not a folder"), staged_output(tmp_path / "bundle"):
        pass


def test_force_replaces_only_on_success(tmp_path: Path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt), staged_output(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
        raise KeyboardInterrupt
    assert _leftovers(out) == ["old.txt"]
    with staged_output(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert _leftovers(out) == ["new.txt"]
    assert _leftovers(tmp_path) == ["bundle"]


def test_tokenizer_files_are_copied_when_present(tmp_path: Path):
    copied = copy_tokenizer_files(TINY_QWEN2, tmp_path)
    assert copied == [name for name in TOKENIZER_FILES if (TINY_QWEN2 / name).is_file()]
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(copied)
    assert sorted(copied) == _leftovers(tmp_path)


@pytest.mark.parametrize("interruption", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_package_interrupted_mid_build_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interruption: BaseException
):
    """The graph and weights are already saved when writing the card fails."""

    def fail(*args, **kwargs):
        raise interruption

    monkeypatch.setattr(packager, "render_card", fail)
    out = tmp_path / "out"
    with pytest.raises(type(interruption)):
        packager.package(TINY_QWEN2, "cpu", out, quiet=True)
    assert _leftovers(tmp_path) == []


def test_package_refuses_existing_output_before_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    monkeypatch.setattr(packager, "build", lambda *a, **k: pytest.fail("must not build"))
    with pytest.raises(BundleError, match="not empty"):
        packager.package(TINY_QWEN2, "cpu", out, quiet=True)
    assert _leftovers(out) == ["keep.txt"]


def test_package_force_replaces_existing_output(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    packager.package(TINY_QWEN2, "cpu", out, force=True, quiet=True, smoke_test=False)
    assert not (out / "old.txt").exists() and (out / "genai_config.json").is_file()
    assert _leftovers(tmp_path) == ["out"]


def test_package_refuses_to_replace_the_checkpoint(tmp_path: Path):
    checkpoint = shutil.copytree(TINY_QWEN2, tmp_path / "ckpt")
    before = _leftovers(checkpoint)
    with pytest.raises(BundleError, match="would replace the checkpoint"):
        packager.package(checkpoint, "cpu", checkpoint, force=True, quiet=True)
    with pytest.raises(BundleError, match="would replace the checkpoint"):
        packager.package(checkpoint, "cpu", tmp_path, force=True, quiet=True)
    assert _leftovers(checkpoint) == before


@pytest.mark.parametrize("target", ["protected", "parent", "cwd"])
def test_output_may_not_replace_what_it_protects(tmp_path: Path, monkeypatch, target: str):
    checkpoint = tmp_path / "models" / "ckpt"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    out = {"protected": checkpoint, "parent": tmp_path / "models", "cwd": Path(".")}[target]
    what = "the current folder" if target == "cwd" else "the checkpoint"
    with (
        pytest.raises(BundleError, match=f"would replace {what}"),
        staged_output(out, force=True, protect=((checkpoint, "the checkpoint"),)),
    ):
        pytest.fail("the block must not run")
    assert _leftovers(checkpoint) == ["config.json"]


def test_output_under_a_file_is_a_bundle_error(tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "bundle"
    with (
        pytest.raises(BundleError, match=r"afile/bundle: cannot create a folder there"),
        staged_output(out),
    ):
        pytest.fail("the block must not run")
    assert _leftovers(tmp_path) == ["afile"]


def test_an_output_that_cannot_be_replaced_is_a_bundle_error(tmp_path: Path, monkeypatch):
    out = tmp_path / "bundle"
    out.mkdir()

    def busy(source, target):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr("mobius_genai.bundle.output_folder.os.replace", busy)
    with (
        pytest.raises(BundleError, match="cannot replace it .Device or resource busy"),
        staged_output(out, force=True) as staging,
    ):
        (staging / "new.txt").write_text("new")
    assert _leftovers(tmp_path) == ["bundle"]


def test_force_on_a_link_replaces_the_link_and_keeps_its_target(tmp_path: Path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "old.txt").write_text("old")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    with staged_output(link, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert not link.is_symlink() and _leftovers(link) == ["new.txt"]
    assert _leftovers(target) == ["old.txt"]
    assert _leftovers(tmp_path) == ["link", "target"]  # no .old backup left behind
