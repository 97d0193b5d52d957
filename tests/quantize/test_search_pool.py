"""The search's worker processes (`quantize.search_pool`): the same results as in process,
errors raised in the caller, and workers that import no graph-building stack."""

from __future__ import annotations

import operator
import pathlib
import subprocess
import sys
import threading
import time

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


def _planned(lookahead: search_pool.Lookahead, sizes: dict[str, int]) -> dict[str, list]:
    """Weights named by `sizes` planned in that order (chunk i of weight w: [w's number, i])."""
    chunks = {}
    for number, (name, size) in enumerate(sizes.items()):
        chunks[name] = [np.array([number, i]) for i in range(size)]
        lookahead.plan(name, operator.neg, chunks[name].__iter__)
    return chunks


def test_planned_weights_asked_out_of_order_still_get_their_own_results():
    """A weight asked for before those planned ahead of it: what was sent ahead is dropped and
    sent again when its weight is asked; every weight gets its own chunks' results."""
    search_pool._close_pool()
    lookahead = search_pool.Lookahead(workers=2)
    chunks = _planned(lookahead, {"a": 3, "b": 2, "c": 6, "d": 1})
    got = {name: [r.tolist() for r in lookahead.results(name, operator.neg, chunks[name].__iter__)]
           for name in ("a", "c", "b", "d", "a")}  # fmt: skip
    assert got == {name: [(-c).tolist() for c in chunks[name]] for name in chunks}
    assert lookahead.dropped > 0  # b's requests, sent while a was read, answered and dropped
    assert not search_pool._sent


def test_a_pool_closed_between_weights_sends_the_planned_weight_again():
    """The next weight's requests sent ahead are lost when the pool closes (a Ctrl-C
    elsewhere); asked for later, it is sent again from its first chunk."""
    search_pool._close_pool()
    lookahead = search_pool.Lookahead(workers=2)
    chunks = _planned(lookahead, {"a": 2, "b": 5})
    assert len(list(lookahead.results("a", operator.neg, chunks["a"].__iter__))) == 2
    assert search_pool._sent  # b's first chunks are on their way
    search_pool._close_pool()
    got = [r.tolist() for r in lookahead.results("b", operator.neg, chunks["b"].__iter__)]
    assert got == [(-c).tolist() for c in chunks["b"]]


def test_a_worker_computes_its_next_request_while_its_result_is_unread(tmp_path, monkeypatch):
    """Results wait in the worker's writing thread, not in its computing loop: the request a
    worker holds after a large unread result (more than a pipe holds) is computed all the
    same, so a weight ahead of the one being saved keeps both workers busy."""
    search_pool._close_pool()
    marker = tmp_path / "touched"
    seen = []
    receive = search_pool._receive

    def waited(worker):  # before the first result is read: did the third request run?
        for _ in range(100 if not seen else 0):
            if marker.exists():
                break
            time.sleep(0.05)
        seen.append(marker.exists())
        return receive(worker)

    monkeypatch.setattr(search_pool, "_receive", waited)
    lookahead = search_pool.Lookahead(workers=2)
    lookahead.plan("large", operator.neg, [np.zeros(1 << 20), np.zeros(1)].__iter__)
    lookahead.plan("touch", pathlib.Path.touch, [marker].__iter__)  # to the first worker
    assert [r.nbytes for r in lookahead.results("large", operator.neg, list)] == [8 << 20, 8]
    assert seen[0]
    assert list(lookahead.results("touch", pathlib.Path.touch, list)) == [None]
