"""A worker process of `search_pool`: runs the (function, chunk) requests pickled on its stdin
and writes each (failed, result or exception) to its stdout, until its stdin ends.

A thread reads the requests as they come, so the caller's writes never wait for a result to
be computed or read, and another writes the results, so a result the caller has not read yet
(a weight ahead of the one it saves: `search_pool.Lookahead`) does not stop the next
request's computation (the caller bounds how many it sends: `search_pool.QUEUED`)."""

from __future__ import annotations

import pickle
import queue
import signal
import sys
import threading
from typing import Any

_END = None


def _read(requests: Any, inbox: queue.SimpleQueue) -> None:
    """Put each request of `requests` in `inbox`, then _END (after a request that cannot be
    read, the error: the stream is lost past it)."""
    try:
        while True:
            inbox.put(pickle.load(requests))
    except (EOFError, OSError):
        pass
    except Exception as error:  # answered as the request's result
        inbox.put(error)
    inbox.put(_END)


def _write(outbox: queue.SimpleQueue, results: Any) -> None:
    """Write each reply of `outbox` to `results` until _END (or until the caller has gone)."""
    while (reply := outbox.get()) is not _END:
        try:
            pickle.dump(reply, results, pickle.HIGHEST_PROTOCOL)
            results.flush()
        except OSError:  # the caller has gone (or stopped listening)
            return


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C
    requests, results = sys.stdin.buffer, sys.stdout.buffer
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read, args=(requests, inbox), daemon=True).start()
    writer = threading.Thread(target=_write, args=(outbox, results), daemon=True)
    writer.start()
    while (request := inbox.get()) is not _END:
        try:
            if isinstance(request, Exception):
                raise request
            function, chunk = request
            outbox.put((False, function(chunk)))
        except Exception as error:  # sent back and raised in the caller
            outbox.put((True, error))
    outbox.put(_END)
    writer.join()


if __name__ == "__main__":
    main()
