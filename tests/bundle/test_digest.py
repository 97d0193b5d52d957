"""Saving through the write pipeline: the data file's sha256 computed while it is written is the
file's own, failures surface as themselves and lose nothing, memory holds blocks, not tensors."""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import importlib
import io
import json
import shutil
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
import safetensors.numpy

import mobius_genai
from mobius_genai import _buffers
from mobius_genai.bundle import manifest
from mobius_genai.bundle.digest import save_with_digest
from mobius_genai.checkpoint import weights
from mobius_genai.errors import BundleError, WeightsError
from mobius_genai.packager import package
from tests.conftest import TINY_QWEN2


@pytest.fixture(params=[True, False], ids=["background-writes", "writes-in-saving-thread"])
def write_mode(request, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways of writing: pwrite in a writer thread (POSIX) or in the saving thread."""
    digest = importlib.import_module("mobius_genai.bundle.digest")
    monkeypatch.setattr(digest, "_BACKGROUND_WRITES", request.param)
    return request.param


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_manifest_hash_of_the_data_file_is_computed_while_writing(
    precision: str, write_mode: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    hashed_files: list[str] = []
    original = manifest._sha256
    monkeypatch.setattr(
        manifest,
        "_sha256",
        lambda path, stop=None: hashed_files.append(Path(path).name) or original(path),
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
        type(v.const_value).__name__ == "_PipelinedTensor"
        for v in built["model"].graph.initializers.values()
    )


def test_a_failed_write_is_a_bundle_error_and_leaves_the_old_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packaged
):
    out = shutil.copytree(packaged("cpu"), tmp_path / "b")  # the bundle a failed force keeps
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    digest = importlib.import_module("mobius_genai.bundle.digest")
    threads = set(threading.enumerate())  # other tests' threads may end meanwhile

    def disk_full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(digest.os, "pwrite", disk_full)
    with pytest.raises(BundleError, match=r"model\.onnx\.data: writing failed.*No space left"):
        package(TINY_QWEN2, "cpu", out, quiet=True, smoke_test=False, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no partial folder left
    assert set(threading.enumerate()) - threads == set()  # the writer and hasher threads ended


@pytest.mark.parametrize("failure", [WeightsError("read failed"), KeyboardInterrupt()])
def test_an_error_while_converting_is_reported_as_itself(
    failure: BaseException, write_mode: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A failure (or Ctrl-C) in the saving thread stops the pipeline and surfaces unchanged."""
    original = weights.Checkpoint.read
    calls = []

    def failing_read(self, name, index=None):
        calls.append(name)
        if len(calls) == 5:
            raise failure
        return original(self, name, index)

    monkeypatch.setattr(weights.Checkpoint, "read", failing_read)
    threads = set(threading.enumerate())  # other tests' threads may end meanwhile
    with pytest.raises(type(failure)):
        package(TINY_QWEN2, "cpu", tmp_path / "b", quiet=True, smoke_test=False)
    assert len(calls) == 5  # the save stopped at the failure
    assert not (tmp_path / "b").exists()
    assert set(threading.enumerate()) - threads == set()


def test_saving_holds_blocks_not_tensors(
    write_mode: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Peak Python memory while saving stays under half the largest tensor.

    The checkpoint is tiny-qwen2 with a 65,536-row embedding table (16 MiB as float32, tied
    to the lm_head); with 64 KiB blocks the save holds a few blocks at a time. Converting the
    table whole (as numpy() does) fails the bound.
    """
    folder = tmp_path / "wide"
    shutil.copytree(TINY_QWEN2, folder)
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = 65536
    (folder / "config.json").write_text(json.dumps(config))
    tensors = safetensors.numpy.load_file(folder / "model.safetensors")
    table = tensors["model.embed_tokens.weight"]
    rows = np.resize(table.view(np.uint16), (65536, table.shape[1]))
    tensors["model.embed_tokens.weight"] = rows.view(table.dtype)
    safetensors.numpy.save_file(tensors, folder / "model.safetensors")
    built = mobius_genai.build(folder, "cpu", "f32")
    largest = 65536 * table.shape[1] * 4
    monkeypatch.setattr(_buffers, "BLOCK_BYTES", 64 << 10)
    tracemalloc.start()
    try:
        save_with_digest(built, tmp_path / "out", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < largest / 2, f"peak {peak} bytes, largest tensor {largest}"
    saved = ir.load(tmp_path / "out" / "model.onnx")
    np.testing.assert_array_equal(
        saved.graph.initializers["model.embed_tokens.weight"].const_value.numpy(),
        rows.view(table.dtype).astype(np.float32),
    )


@pytest.mark.parametrize(
    "dtype",
    [
        ir.DataType.FLOAT,
        ir.DataType.FLOAT16,
        ir.DataType.BFLOAT16,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.BOOL,
        ir.DataType.INT4,
        ir.DataType.UINT4,
    ],
)
def test_bytes_written_for_in_memory_tensors_are_onnx_irs_encoding(dtype: ir.DataType):
    digest = importlib.import_module("mobius_genai.bundle.digest")
    values = np.arange(-7, 8, dtype=np.int64).reshape(3, 5) % (
        2 if dtype == ir.DataType.BOOL else 8
    )
    tensor = ir.Tensor(values.astype(dtype.numpy()), dtype=dtype)
    assert digest._bytes_of(tensor).tobytes() == tensor.tobytes()


def test_a_failed_write_in_the_saving_thread_is_kept_and_buffers_come_back():
    digest = importlib.import_module("mobius_genai.bundle.digest")

    class FullDisk(io.BytesIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    pool = _buffers.BufferPool(nbytes=16, limit=1)
    pipeline = digest._Pipeline(pool, background_writes=False)
    buffer = pool.take()
    with pytest.raises(OSError, match="No space left"):
        pipeline.put(FullDisk(), 0, buffer[:8], buffer)
    with pytest.raises(OSError, match="No space left"):
        pipeline.close()
    assert pipeline.error is not None
    assert pool.take() is buffer  # given back although the write failed


def test_a_failed_package_cancels_the_checkpoint_hashes(tmp_path: Path, monkeypatch):
    """A build that fails (or is interrupted) must not wait for hashes of a 30 GB checkpoint:
    queued ones are dropped and a running one stops at its next chunk."""
    monkeypatch.setattr(manifest, "_CHUNK", 1 << 10)
    started, release = threading.Event(), threading.Event()
    real_sha256 = manifest._sha256
    outcomes = []

    def slow_sha256(path, stop=None):
        started.set()
        release.wait(5)  # hold the hashing thread until the build has failed
        try:
            digest = real_sha256(path, stop)
        except concurrent.futures.CancelledError:
            outcomes.append((Path(path).name, "cancelled"))
            raise
        outcomes.append((Path(path).name, "finished"))
        return digest

    monkeypatch.setattr(manifest, "_sha256", slow_sha256)
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).bytes(1 << 22))
    queued = tmp_path / "queued.bin"
    queued.write_bytes(b"x" * 1000)

    def failing_build(*args, **kwargs):
        manifest.hash_in_background([big, queued])
        started.wait(5)
        raise KeyboardInterrupt

    monkeypatch.setattr(mobius_genai.packager, "build", failing_build)
    with pytest.raises(KeyboardInterrupt):
        package(TINY_QWEN2, "cpu", tmp_path / "out", quiet=True)
    futures = [manifest._pending.get(manifest._key(path)) for path in (big, queued)]
    assert futures == [None, None]  # nothing left for a later sha256_file to wait on
    release.set()
    manifest._hasher.submit(lambda: None).result(timeout=5)  # the thread is free again
    assert outcomes == [("big.bin", "cancelled")]  # stopped mid-file; the queued one never ran
    assert manifest.sha256_file(big) == real_sha256(big)  # hashed afresh, correctly


def test_background_hashes_never_hold_up_the_exit(tmp_path: Path):
    """An interrupted package exits at once: the hashing thread is a daemon thread."""
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x" * 1000)
    manifest.hash_in_background([path])
    hashers = [thread for thread in threading.enumerate() if thread.name.startswith("sha256")]
    assert hashers and all(thread.daemon for thread in hashers)
    assert manifest.sha256_file(path) == hashlib.sha256(b"x" * 1000).hexdigest()
