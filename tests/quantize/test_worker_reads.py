"""The search's workers read their own columns from the checkpoint file (`file_rows`): the
calling process sends where they lie instead of reading, widening and pickling them, and the
bundle's bytes are those of the search in one process."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import mobius_genai
from mobius_genai import progress
from mobius_genai.errors import WeightsError
from mobius_genai.quantize import layout, search_pool, streaming
from mobius_genai.quantize.layout import quantize_matmul_nbits_columns
from mobius_genai.quantize.weight_uses import find_weights
from tests.conftest import TINY_QWEN2

F32 = np.dtype(np.float32)


def _bf16_checkpoint(dest: Path, nan_in: str) -> Path:
    """tests/data/tiny-qwen2 (bfloat16, tied) with a NaN in tensor `nan_in`."""
    shutil.copytree(TINY_QWEN2, dest, dirs_exist_ok=True)
    tensors = load_file(dest / "model.safetensors")
    tensors[nan_in][5, 7] = float("nan")
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


@pytest.fixture
def bf16_ckpt() -> Path:
    """tests/data/tiny-qwen2, whose weights are stored in bfloat16."""
    table = load_file(TINY_QWEN2 / "model.safetensors")["model.embed_tokens.weight"]
    assert table.dtype == torch.bfloat16
    return TINY_QWEN2


def _sources(checkpoint: Path) -> list:
    built = mobius_genai.build(checkpoint, "cpu", progress=False)
    groups, _ = find_weights(built[built.decoder_key].graph)
    return [group.source for group in groups]


def _in_workers(monkeypatch) -> list:
    """Every searched weight to two workers; the requests sent are recorded."""
    monkeypatch.setattr(layout, "PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(search_pool, "search_workers", lambda: 2)
    requests = []
    original = streaming._stored_columns_request

    def recorded(*args):
        requests.append(args[1:3])
        return original(*args)

    monkeypatch.setattr(streaming, "_stored_columns_request", recorded)
    return requests


def test_a_request_reads_the_columns_the_caller_reads(bf16_ckpt):
    """bfloat16 stored rows widened in the reading process: the same float32 bits, for every
    weight (packed q/k/v across its parts, the embedding table) and column range."""
    sources = _sources(bf16_ckpt)
    assert {s.name for s in sources if s.column_request() is None} == set()
    assert any(len(streaming._parts_along_n(s)) == 3 for s in sources)  # packed q/k/v
    for source in sources:
        for start, stop in ((0, source.n), (1, source.n - 3), (source.n // 3, source.n // 2 + 1)):
            ours = source.column_request()(start, stop, F32)()
            expected = source.column_reader()(start, stop, F32)
            assert ours.flags.c_contiguous
            np.testing.assert_array_equal(ours.view(np.uint32), expected.view(np.uint32))


def test_workers_reading_the_file_give_the_bytes_of_one_process(bf16_ckpt, tmp_path, monkeypatch):
    here = mobius_genai.package(
        bf16_ckpt, "cpu", tmp_path / "here", precision="int4", smoke_test=False, quiet=True
    )
    requests = _in_workers(monkeypatch)
    pooled = mobius_genai.package(
        bf16_ckpt, "cpu", tmp_path / "pool", precision="int4", smoke_test=False, quiet=True
    )
    assert requests and search_pool._workers  # the workers read the columns
    data = sorted(path.name for path in here.iterdir() if path.name.startswith("model.onnx"))
    assert data == ["model.onnx", "model.onnx.data"]
    for name in data:
        assert (pooled / name).read_bytes() == (here / name).read_bytes(), name


def test_a_nan_a_worker_reads_is_the_callers_error_naming_the_tensor(tmp_path, monkeypatch):
    checkpoint = _bf16_checkpoint(tmp_path, nan_in="model.layers.1.mlp.up_proj.weight")
    (source,) = [s for s in _sources(checkpoint) if "layers.1.mlp.up_proj" in s.name]

    def quantize():
        return quantize_matmul_nbits_columns(
            source.column_reader(), source.k, source.n, F32, 32, False, search=True,
            chunk_elements=source.k * 16, request=source.column_request(),
        )  # fmt: skip

    with pytest.raises(WeightsError) as here:
        quantize()
    requests = _in_workers(monkeypatch)
    with pytest.raises(WeightsError) as pooled:
        quantize()
    assert requests
    assert str(pooled.value) == str(here.value)
    assert "model.layers.1.mlp.up_proj.weight" in str(pooled.value)


def test_an_interrupted_package_leaves_no_bundle_and_no_worker(bf16_ckpt, tmp_path, monkeypatch):
    _in_workers(monkeypatch)
    started = []
    pool = search_pool._pool
    monkeypatch.setattr(
        search_pool, "_pool", lambda count: started.extend(pool(count)) or pool(count)
    )
    search_pool._close_pool()  # workers of earlier tests would not be this package's
    calls = []
    item_part = progress.item_part

    def interrupted(done, total):
        calls.append(done)
        if len(calls) == 5:
            raise KeyboardInterrupt
        item_part(done, total)

    monkeypatch.setattr(progress, "item_part", interrupted)
    out = tmp_path / "bundle"
    with pytest.raises(KeyboardInterrupt):
        mobius_genai.package(bf16_ckpt, "cpu", out, precision="int4", smoke_test=False, quiet=True)
    assert started and not search_pool._workers
    assert not out.exists() and list(tmp_path.iterdir()) == []
    for worker in started:
        assert worker.returncode is not None  # ended and reaped
        assert not os.path.exists(f"/proc/{worker.pid}")


def test_the_next_weight_is_sent_before_this_ones_last_result_is_read(
    bf16_ckpt, tmp_path, monkeypatch
):
    """No core idles at a weight's end (issue 29): the first request of each weight the pool
    searches is sent while the weight saved before it still has a result to read."""
    _in_workers(monkeypatch)
    events = []  # ("sent", the weight's search function) / ("read",), in order
    dump, receive = pickle.dump, search_pool._receive

    def sent(request, *args):
        events.append(("sent", request[0]))
        dump(request, *args)

    def read(worker):
        events.append(("read",))
        return receive(worker)

    monkeypatch.setattr(search_pool, "pickle", SimpleNamespace(**{**vars(pickle), "dump": sent}))
    monkeypatch.setattr(search_pool, "_receive", read)
    mobius_genai.package(
        bf16_ckpt, "cpu", tmp_path / "b", precision="int4", smoke_test=False, quiet=True
    )
    weights = [event[1] for event in events if event[0] == "sent"]  # request i's weight
    reads = [i for i, event in enumerate(events) if event[0] == "read"]  # event of read i
    sends = [i for i, event in enumerate(events) if event[0] == "sent"]
    firsts = [i for i in range(1, len(weights)) if weights[i] is not weights[i - 1]]
    assert len(firsts) >= 10  # every weight of the tiny model, one after the other
    assert len(reads) == len(sends)
    late = [i for i in firsts if sends[i] > reads[i - 1]]  # sent after the last read before it
    assert late == []
