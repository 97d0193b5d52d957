"""Fixtures for packaging tests: the committed tiny checkpoint and bundles packaged from it."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mobius_genai import packager
from mobius_genai.bundle.graph import GQA_OP, GraphInfo, TensorSpec

TINY_QWEN2 = Path(__file__).resolve().parents[1] / "data" / "tiny-qwen2"


_FLOAT = 1
_INT64 = 7


def toy_graph(
    *,
    layers: int = 2,
    kv_heads: int = 2,
    head_size: int = 16,
    vocab: int = 384,
    position_ids: bool = True,
    gqa: bool = False,
) -> GraphInfo:
    """A GraphInfo with the standard decoder I/O contract, without any ONNX file."""
    inputs = {
        "input_ids": TensorSpec(_INT64, ("batch", "seq")),
        "attention_mask": TensorSpec(_INT64, ("batch", "total")),
    }
    if position_ids:
        inputs["position_ids"] = TensorSpec(_INT64, ("batch", "seq"))
    outputs = {"logits": TensorSpec(_FLOAT, ("batch", "seq", vocab))}
    for i in range(layers):
        for role in ("key", "value"):
            inputs[f"past_key_values.{i}.{role}"] = TensorSpec(
                _FLOAT, ("batch", kv_heads, "past", head_size)
            )
            outputs[f"present.{i}.{role}"] = TensorSpec(
                _FLOAT, ("batch", kv_heads, "total", head_size)
            )
    ops = {"ai.onnx::MatMul", GQA_OP if gqa else "ai.onnx::Attention"}
    return GraphInfo(inputs=inputs, outputs=outputs, ops=frozenset(ops))


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
def tiny_checkpoint() -> Path:
    return TINY_QWEN2


@pytest.fixture(scope="session")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Package the tiny checkpoint once per EP (no smoke test); returns the bundle folder."""
    cache: dict[str, Path] = {}

    def make(ep: str) -> Path:
        if ep not in cache:
            out = tmp_path_factory.mktemp("bundles") / f"tiny-{ep}"
            cache[ep] = packager.package(TINY_QWEN2, ep, out, smoke_test=False, quiet=True)
        return cache[ep]

    return make


@pytest.fixture(scope="session")
def pruned_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint packaged for cpu with its LM head pruned to the last position (no
    smoke test): a bundle og.Generator runs and og.Engine does not."""
    out = tmp_path_factory.mktemp("bundles") / "tiny-pruned-head"
    return packager.package(
        TINY_QWEN2, "cpu", out, smoke_test=False, quiet=True, prune_lm_head=True
    )


@pytest.fixture
def bundle_copy(packaged: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """A private, editable copy of a packaged bundle."""

    def make(ep: str = "cpu") -> Path:
        dest = tmp_path / f"copy-{ep}"
        shutil.copytree(packaged(ep), dest)
        return dest

    return make
