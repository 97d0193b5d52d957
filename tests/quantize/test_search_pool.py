"""The search's worker processes (`quantize.search_pool`): the same results as in process,
errors raised in the caller, and workers that import no graph-building stack."""

from __future__ import annotations

import operator
import subprocess
import sys
import threading

import numpy as np
import pytest

from mobius_genai.quantize import layout, search_pool
from mobius_genai.quantize.layout import quantize_matmul_nbits_columns


def test_chunks_map_in_order_in_two_workers():
    chunks = [np.arange(i, i + 5) for i in range(7)]
    results = list(search_pool.map_chunks(operator.neg, chunks, parallel=True, workers=2))
    assert len(search_pool._workers) >= 2
    assert [r.tolist() for r in results] == [(-c).tolist() for c in chunks]


def test_each_worker_holds_its_next_chunk_before_a_result_is_read():
    """A worker never waits for this process to read another worker's result before it gets
    work: QUEUED requests each are sent before the first result is read."""
    taken = []

    def chunks():
        for index in range(12):
            taken.append(index)
            yield np.full(3, index)

    results = search_pool.map_chunks(operator.neg, chunks(), parallel=True, workers=2)
    assert next(results).tolist() == [0, 0, 0]
    assert len(taken) >= search_pool.QUEUED * 2
    assert [r[0] for r in results] == [-i for i in range(1, 12)]


def test_large_chunks_both_ways_do_not_block_the_pipes():
    """Requests and results of 8 MB, two in flight per worker: a worker reads its requests on a
    thread of its own, so this process's writes never wait on a worker writing a result."""
    chunks = [np.full(1 << 21, i, np.float32) for i in range(6)]
    done = []
    thread = threading.Thread(
        target=lambda: done.extend(
            search_pool.map_chunks(operator.neg, chunks, parallel=True, workers=2)
        ),
        daemon=True,
    )
    thread.start()
    thread.join(120)
    assert [float(r[0]) for r in done] == [-float(i) for i in range(6)]


def test_an_error_in_a_worker_is_raised_here_and_the_pool_recovers():
    chunks = [np.ones(3), "not an array", np.ones(3), np.ones(3)]
    with pytest.raises(TypeError):
        list(search_pool.map_chunks(operator.neg, chunks, parallel=True, workers=2))
    assert not search_pool._workers  # closed: its pending results would answer later requests
    again = search_pool.map_chunks(operator.neg, [np.ones(2)] * 3, parallel=True, workers=2)
    assert [r.tolist() for r in again] == [[-1.0, -1.0]] * 3


@pytest.mark.parametrize("weighted", [False, True])
def test_the_search_in_workers_equals_the_search_here(weighted, monkeypatch):
    rng = np.random.default_rng(3)
    k, n = 256, 96
    weight = rng.standard_normal((k, n)).astype(np.float32)
    importance = rng.random(k).astype(np.float32) if weighted else None

    def read(start, stop, dtype):
        return np.ascontiguousarray(weight[:, start:stop], dtype=dtype)

    def quantized():
        return quantize_matmul_nbits_columns(
            read, k, n, weight.dtype, 32, False, search=True, chunk_elements=k * 8,
            importance=importance,
        )  # fmt: skip

    here = quantized()
    monkeypatch.setattr(layout, "PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(search_pool, "search_workers", lambda: 2)
    workers = quantized()
    assert search_pool._workers
    for ours, expected in zip(
        (workers.packed, workers.scales, workers.zero_points),
        (here.packed, here.scales, here.zero_points),
        strict=True,
    ):
        np.testing.assert_array_equal(ours, expected)


def test_a_worker_loads_numpy_and_the_rounding_code_only():
    code = (
        "import sys, mobius_genai.quantize._search_worker, mobius_genai.quantize.layout, "
        "mobius_genai.checkpoint.file_rows; print(sorted({'onnx', 'onnx_ir', 'onnxruntime', "
        "'onnxscript', 'ml_dtypes', 'mobius_genai.checkpoint.weights'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_search_stopped_by_ctrl_c_ends_its_workers_at_once(monkeypatch):
    """The interrupted search closes its pool when the interruption passes, not when the
    traceback (which holds the search's frame) is collected: chunks in flight would answer the
    next search's requests."""
    from mobius_genai import progress

    monkeypatch.setattr(layout, "PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(search_pool, "search_workers", lambda: 2)

    def interrupted(done, total):
        raise KeyboardInterrupt

    monkeypatch.setattr(progress, "item_part", interrupted)
    weight = np.random.default_rng(5).standard_normal((64, 96)).astype(np.float32)
    with pytest.raises(KeyboardInterrupt) as caught:
        layout.quantize_matmul_nbits(weight, 32, False, search=True, chunk_elements=64 * 8)
    assert caught.value is not None  # the traceback is still held here
    assert not search_pool._workers
