"""Holding Ctrl-C and SIGTERM back through a step that must not be cut in two.

A step such as swapping the output folder, or starting a child process and taking charge of
it, leaves something behind if an interrupt lands in its middle; the signal is delivered
right after the step instead.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back until the block is done, then deliver them (main thread
    only: other threads cannot set handlers, and signals reach the main thread anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {}
    for number in _HELD:
        if signal.getsignal(number) is not None:  # None: set outside Python, not restorable
            previous[number] = signal.signal(number, lambda n, frame: received.append(n))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in received:
            signal.raise_signal(number)


@contextlib.contextmanager
def threads_leave_signals_to_main() -> Iterator[None]:
    """Threads started in the block (onnxruntime's thread pools, started as a model loads) leave
    Ctrl-C and SIGTERM to the main thread: a thread starts with its creator's signal mask, and
    both are blocked here until the block ends (then delivered). Otherwise the kernel may hand
    Ctrl-C to a pool thread while the main thread waits in a read (chat's prompt), which then
    never sees it."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no per-thread masks
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
