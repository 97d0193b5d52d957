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
import contextlib
import os
import pickle
import subprocess
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from mobius_genai._child_process import python_command

__all__ = ["MAX_WORKERS", "PARALLEL_ELEMENTS", "Lookahead", "map_chunks", "search_workers"]

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
#: The requests in flight, oldest first: (worker, (Lookahead, weight key)).
_sent: collections.deque[tuple[subprocess.Popen, tuple]] = collections.deque()


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
    if not parallel:
        yield from map(function, chunks)
        return
    key = object()
    yield from Lookahead(workers).results(key, function, lambda: chunks)


class Lookahead:
    """Searches of several weights, planned in the order they will be asked for, so the
    workers start the next weight's chunks while this process still saves the current one
    (without it, a core idles at every weight's end: issue 29).

    At most QUEUED requests per worker are in flight, whichever weights they are of, and a
    result is read only when its weight is asked for (its worker holds it meanwhile), so what
    is ahead is a few chunks, never whole weights. A weight asked for out of plan order is
    still right: the requests sent ahead of it are answered and dropped (`dropped` counts
    them), and its own chunks are sent then.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = search_workers() if workers is None else workers
        self._planned: collections.deque[_Planned] = collections.deque()
        #: Requests whose results were read and thrown away (a weight asked out of order).
        self.dropped = 0

    def plan(
        self, key: object, function: Callable[[Any], Any], chunks: Callable[[], Iterable[Any]]
    ) -> None:
        """Weight `key` will be asked for after those planned before it: `chunks()` (called
        when its first request is sent) gives its chunks for `function`."""
        self._planned.append(_Planned(key, function, chunks))

    def results(
        self, key: object, function: Callable[[Any], Any], chunks: Callable[[], Iterable[Any]]
    ) -> Generator[Any, None, None]:
        """`map(function, chunks())` of weight `key`, in the workers; then those of the
        weights planned after it are sent as these results are read."""
        if self.workers < 2:
            yield from map(function, chunks())
            return
        pool = _pool(self.workers)
        tag = (self, key)
        try:
            self._start(key, function, chunks, tag)
            while True:
                self._send(pool, tag)
                if not _sent or _sent[0][1] != tag:
                    return
                yield _received()
        except BaseException:  # (an error, Ctrl-C, the caller stopping early)
            _close_pool()  # results still on their way would answer the next requests
            self._planned.clear()
            raise

    def _start(
        self,
        key: object,
        function: Callable[[Any], Any],
        chunks: Callable[[], Iterable[Any]],
        tag: tuple,
    ) -> None:
        """Drop what was sent ahead of `key`'s requests (their weights start again when
        asked); put `key` first in the plan unless its requests are on their way."""
        while _sent and _sent[0][1] != tag:
            owner, dropped_key = _drop()
            self.dropped += 1
            for planned in self._planned if owner is self else ():
                if planned.key is dropped_key:
                    planned.restart()
        if _sent:
            return
        keys = [planned.key for planned in self._planned]
        if key in keys:  # (by identity: keys are plain objects)
            for _ in range(keys.index(key)):
                self._planned.popleft()
            self._planned[0].restart()
        else:
            self._planned.appendleft(_Planned(key, function, chunks))

    def _send(self, pool: list[subprocess.Popen], tag: tuple) -> None:
        """Requests from the plan, in order, until each worker holds QUEUED."""
        while len(_sent) < QUEUED * len(pool) and self._planned:
            planned = self._planned[0]
            chunk = planned.next_chunk()
            if chunk is _DONE:
                self._planned.popleft()
                continue
            worker = min(pool, key=lambda w: sum(sent is w for sent, _ in _sent))
            pickle.dump((planned.function, chunk), worker.stdin, pickle.HIGHEST_PROTOCOL)  # type: ignore[arg-type]
            worker.stdin.flush()  # type: ignore[union-attr]
            _sent.append((worker, (self, planned.key)))


_DONE = object()


class _Planned:
    """One weight's search: its chunks, made when the first is sent."""

    def __init__(
        self, key: object, function: Callable[[Any], Any], chunks: Callable[[], Iterable[Any]]
    ) -> None:
        self.key, self.function, self._chunks = key, function, chunks
        self._iterator: Iterator[Any] | None = None

    def restart(self) -> None:
        """Send its chunks from the first again (those sent were dropped or lost)."""
        self._iterator = None

    def next_chunk(self) -> Any:
        """The next chunk to send, or _DONE."""
        if self._iterator is None:
            self._iterator = iter(self._chunks())
        return next(self._iterator, _DONE)


def _received() -> Any:
    """The result of the oldest request (each worker answers its requests in order)."""
    worker, _ = _sent.popleft()
    return _receive(worker)


def _drop() -> tuple:
    """Read and throw away the oldest request's result (an error included): its tag."""
    worker, tag = _sent.popleft()
    with contextlib.suppress(Exception):
        _receive(worker)
    return tag


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
    _sent.clear()
    while _workers:
        worker = _workers.pop()
        for stream in (worker.stdin, worker.stdout):
            if stream is not None:
                stream.close()
        worker.wait()
