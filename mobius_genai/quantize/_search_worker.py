"""A worker process of `search_pool`: runs the (function, chunk) requests pickled on its stdin
and writes each (failed, result or exception) to its stdout, until its stdin ends."""

from __future__ import annotations

import pickle
import signal
import sys


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C
    requests, results = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            function, chunk = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = (False, function(chunk))
        except Exception as error:  # sent back and raised in the caller
            reply = (True, error)
        try:
            pickle.dump(reply, results, pickle.HIGHEST_PROTOCOL)
            results.flush()
        except OSError:  # the caller has gone (or stopped listening)
            return


if __name__ == "__main__":
    main()
