"""The per-block search of large weights, spread over worker processes.

`rounding.search_blocks` runs in numpy at ~0.1 s per million weights on one core, in steps
small enough that threads mostly wait for the GIL (two threads: 0.9-1.3x one): a 7B's 7.6
billion weights take ~13 minutes. Blocks are independent, so the column chunks of a weight go
to worker processes, one per core this process may use (at most MAX_WORKERS), each holding at
most QUEUED chunks (the one it computes, the next); results come back in order, and a chunk is computed as it would be here, so the output
does not depend on the workers.

A worker is a fresh interpreter started isolated (`_child_process.python_command`: nothing from
the working folder, PYTHONPATH or the user's site-packages runs in it) that imports numpy and
the rounding code only (~40 MB), not the caller's `__main__` (as multiprocessing's
spawn would: a user's unguarded script would run again) nor a forked copy of the caller's
memory and threads. Requests and results are pickled over its pipes: they are our own chunks
and functions, never checkpoint objects. Workers ignore Ctrl-C (the caller handles it) and
end when the caller does (their stdin closes).
"""

from __future__ import annotations

import atexit
import collections
import os
import pickle
import subprocess
from collections.abc import Callable, Generator, Iterable
from typing import Any

from mobius_genai._child_process import python_command

__all__ = ["MAX_WORKERS", "PARALLEL_ELEMENTS", "map_chunks", "search_workers"]

#: Weights with fewer elements are searched in the calling process (the workers' start and the
#: pickling are not worth it there). The calling process is the serial part of a package (it
#: reads, converts, calibrates and writes): with 256K rather than 2M, the Qwen2.5-0.5B shape's
#: q and o projections go to the workers too, and its own CPU time drops from ~10.4 to ~8.7 s
#: (benchmarks/README.md, "The int4 search's speed").
PARALLEL_ELEMENTS = 1 << 18
#: Most worker processes (each holds a chunk, its search temporaries and ~40 MB of modules).
MAX_WORKERS = 8
#: Requests each worker holds at most: the one it computes and the next, so that it never
#: waits for this process to read an earlier result from another worker before it gets work
#: (its stdin is read by a thread of its own, so a request never blocks this process).
QUEUED = 2

_WORKER = "mobius_genai.quantize._search_worker"
_workers: list[subprocess.Popen] = []


def search_workers() -> int:
    """Worker processes for the search: the cores this process may run on, at most
    MAX_WORKERS; 1 means none (the search runs in the caller)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return min(cores, MAX_WORKERS)


def map_chunks(
    function: Callable[[Any], Any],
    chunks: Iterable[Any],
    *,
    parallel: bool,
    workers: int | None = None,
) -> Generator[Any, None, None]:
    """`map(function, chunks)`, in `workers` (default `search_workers()`) worker processes
    when `parallel` and there is more than one. `function` must be picklable by reference (a
    module-level function, or a functools.partial of one with picklable arguments)."""
    count = search_workers() if workers is None else workers
    if not parallel or count < 2:
        yield from map(function, chunks)
        return
    pool = _pool(count)
    in_flight = dict.fromkeys(pool, 0)
    order: collections.deque[subprocess.Popen] = collections.deque()  # oldest request first
    try:
        for chunk in chunks:
            while len(order) >= QUEUED * len(pool):
                yield _received(order, in_flight)
            worker = min(pool, key=in_flight.__getitem__)
            pickle.dump((function, chunk), worker.stdin, pickle.HIGHEST_PROTOCOL)  # type: ignore[arg-type]
            worker.stdin.flush()  # type: ignore[union-attr]
            in_flight[worker] += 1
            order.append(worker)
        while order:
            yield _received(order, in_flight)
    except BaseException:  # (an error, Ctrl-C, the caller stopping early)
        _close_pool()  # results still on their way would answer the next requests
        raise


def _received(order: collections.deque[subprocess.Popen], in_flight: dict) -> Any:
    """The result of the oldest request (each worker answers its requests in order)."""
    worker = order.popleft()
    in_flight[worker] -= 1
    return _receive(worker)


def _receive(worker: subprocess.Popen) -> Any:
    """The next result of `worker` (its exception re-raised here)."""
    try:
        failed, value = pickle.load(worker.stdout)  # type: ignore[arg-type]
    except EOFError:
        raise RuntimeError(
            f"a search worker process ended unexpectedly (exit code {worker.wait()})"
        ) from None
    if failed:
        raise value
    return value


def _pool(count: int) -> list[subprocess.Popen]:
    """`count` workers, started on first use and kept for the process's life."""
    if len(_workers) < count:
        if not _workers:
            atexit.register(_close_pool)
        command = python_command(_WORKER)
        _workers.extend(
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for _ in range(count - len(_workers))
        )
    return _workers[:count]


def _close_pool() -> None:
    """End the workers: they stop at the end of their input."""
    while _workers:
        worker = _workers.pop()
        for stream in (worker.stdin, worker.stdout):
            if stream is not None:
                stream.close()
        worker.wait()
