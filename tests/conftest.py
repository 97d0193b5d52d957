"""What every test folder shares: the committed tiny checkpoint, and bundles packaged once per
session (no smoke test: each test runs what it checks) from it and from tiny vision-language
checkpoints. A test that changes a bundle takes `bundle_copy`; a test of packaging itself, or
one that needs other options, packages its own."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import mobius_genai  # its package() loads the graph-building stack on the first call

#: The committed tiny Qwen2: tied embeddings, vocab 384, hidden 64, 2 layers, bf16 weights.
TINY_QWEN2 = Path(__file__).resolve().parent / "data" / "tiny-qwen2"


def hub_snapshot(cache: Path, repo: str = "models--org--tiny", files: Path = TINY_QWEN2) -> Path:
    """A huggingface_hub cache entry `repo` in `cache` holding `files` (a folder's files):
    blobs named by their sha256 and a snapshot folder of relative links `../../blobs/<sha>`,
    exactly as snapshot_download makes them."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    root = cache / repo
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)
    snapshot = root / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for file in sorted(files.iterdir()):
        data = file.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        (root / "blobs" / sha).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / sha)
    return snapshot


@pytest.fixture(scope="session")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """The tiny checkpoint packaged once per EP, precision and head (no smoke test): the folder
    of `packaged(ep, precision=None, prune_lm_head=False)`, shared: never change it. Each is
    named `tiny` (`serve` names the model after its folder)."""
    cache: dict[tuple[str, str | None, bool], Path] = {}

    def make(ep: str, precision: str | None = None, prune_lm_head: bool = False) -> Path:
        key = (ep, precision, prune_lm_head)
        if key not in cache:
            kind = "-".join([ep, precision or "float", "pruned" if prune_lm_head else "full"])
            out = tmp_path_factory.mktemp(kind) / "tiny"
            cache[key] = mobius_genai.package(
                TINY_QWEN2,
                ep,
                out,
                precision=precision,
                prune_lm_head=prune_lm_head,
                smoke_test=False,
                quiet=True,
            )
        return cache[key]

    return make


@pytest.fixture(scope="session")
def pruned_head(packaged: Callable[..., Path]) -> Path:
    """The tiny checkpoint packaged for cpu with its LM head pruned to the last position (no
    smoke test): a bundle og.Generator runs and og.Engine does not."""
    return packaged("cpu", prune_lm_head=True)


@pytest.fixture(scope="session")
def tiny_int4(packaged: Callable[..., Path]) -> Path:
    """The tiny checkpoint packaged for cpu in int4 with the default int4 options."""
    return packaged("cpu", precision="int4")


@pytest.fixture
def bundle_copy(packaged: Callable[..., Path], tmp_path: Path) -> Callable[[str], Path]:
    """A private, editable copy of a packaged bundle."""

    def make(ep: str = "cpu") -> Path:
        dest = tmp_path / f"copy-{ep}"
        shutil.copytree(packaged(ep), dest)
        return dest

    return make


# The vision-language fixtures import torch and transformers when a test asks for them, not
# when any test session starts.


def _cpu_bundle(folder: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The checkpoint in `folder` packaged for cpu without the smoke test (one build a session)."""
    out = tmp_path_factory.mktemp(name) / "bundle"
    return mobius_genai.package(folder, "cpu", out, quiet=True, smoke_test=False)


@pytest.fixture(scope="session")
def gemma3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model, folder): a tiny Gemma 3 with tiny-qwen2's tokenizer and image processor settings."""
    from tests._vlm import write_gemma3_checkpoint

    folder = tmp_path_factory.mktemp("gemma3-ckpt")
    return write_gemma3_checkpoint(folder), folder


@pytest.fixture(scope="session")
def gemma3_bundle(gemma3_checkpoint: tuple, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Gemma 3 checkpoint packaged for cpu without the smoke test."""
    return _cpu_bundle(gemma3_checkpoint[1], tmp_path_factory, "gemma3-bundle")


@pytest.fixture(scope="session")
def mistral3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model, folder): a tiny Mistral 3 with tiny-qwen2's tokenizer and processor settings."""
    from tests._mistral3 import write_mistral3_checkpoint

    folder = tmp_path_factory.mktemp("mistral3-ckpt")
    return write_mistral3_checkpoint(folder), folder


@pytest.fixture(scope="session")
def mistral3_bundle(mistral3_checkpoint: tuple, tmp_path_factory) -> Path:
    """The Mistral 3 checkpoint packaged for cpu without the smoke test."""
    return _cpu_bundle(mistral3_checkpoint[1], tmp_path_factory, "mistral3-bundle")


@pytest.fixture(scope="session")
def qwen2_5_vl_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model, folder): a tiny Qwen2.5-VL with tiny-qwen2's tokenizer and processor settings."""
    from tests._qwen_vl import write_qwen2_5_vl_checkpoint

    folder = tmp_path_factory.mktemp("qwen2_5_vl-ckpt")
    return write_qwen2_5_vl_checkpoint(folder), folder


@pytest.fixture(scope="session")
def qwen2_5_vl_bundle(qwen2_5_vl_checkpoint: tuple, tmp_path_factory) -> Path:
    """The Qwen2.5-VL checkpoint packaged for cpu without the smoke test."""
    return _cpu_bundle(qwen2_5_vl_checkpoint[1], tmp_path_factory, "qwen2_5_vl-bundle")


@pytest.fixture(scope="session")
def qwen3_vl_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model, folder): a tiny Qwen3-VL with tiny-qwen2's tokenizer and processor settings."""
    from tests._qwen3_vl import write_qwen3_vl_checkpoint

    folder = tmp_path_factory.mktemp("qwen3_vl-ckpt")
    return write_qwen3_vl_checkpoint(folder), folder


@pytest.fixture(scope="session")
def qwen3_vl_moe_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model, folder): a tiny Qwen3-VL-MoE, its experts in the hub's layout."""
    from tests._qwen3_vl import write_qwen3_vl_checkpoint

    folder = tmp_path_factory.mktemp("qwen3_vl_moe-ckpt")
    return write_qwen3_vl_checkpoint(folder, moe=True), folder


@pytest.fixture(scope="session")
def qwen3_vl_bundle(qwen3_vl_checkpoint: tuple, tmp_path_factory) -> Path:
    """The Qwen3-VL checkpoint packaged for cpu without the smoke test."""
    return _cpu_bundle(qwen3_vl_checkpoint[1], tmp_path_factory, "qwen3_vl-bundle")


@pytest.fixture(scope="session")
def lfm2_vl_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model, folder): a tiny LFM2-VL with tiny-qwen2's tokenizer and processor settings."""
    from tests._lfm2_vl import write_lfm2_vl_checkpoint

    folder = tmp_path_factory.mktemp("lfm2_vl-ckpt")
    return write_lfm2_vl_checkpoint(folder), folder


@pytest.fixture(scope="session")
def lfm2_vl_bundle(lfm2_vl_checkpoint: tuple, tmp_path_factory) -> Path:
    """The LFM2-VL checkpoint packaged for cpu without the smoke test."""
    return _cpu_bundle(lfm2_vl_checkpoint[1], tmp_path_factory, "lfm2_vl-bundle")


@pytest.fixture(scope="session")
def gemma4_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(model, folder): a tiny Gemma 4 with tiny-qwen2's tokenizer and processor settings."""
    from tests._gemma4_vision import write_gemma4_checkpoint

    folder = tmp_path_factory.mktemp("gemma4-ckpt")
    return write_gemma4_checkpoint(folder), folder


@pytest.fixture(scope="session")
def gemma4_bundle(gemma4_checkpoint: tuple, tmp_path_factory) -> Path:
    """The Gemma 4 checkpoint packaged for cpu without the smoke test."""
    return _cpu_bundle(gemma4_checkpoint[1], tmp_path_factory, "gemma4-bundle")
