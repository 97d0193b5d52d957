"""Reusable byte buffers for moving tensors through memory a block at a time.

Writing into freshly allocated memory costs a page fault for every 4 KiB page: converting a
checkpoint tensor into a new array took several times longer than converting it into memory
already touched. Tensors are therefore converted block by block into buffers that are handed
back and reused, which also bounds the memory a save holds at a time.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

__all__ = ["BLOCK_BYTES", "BufferPool"]

#: Size of one buffer: large enough that per-block overheads (a read, a write call) vanish,
#: small enough that a few of them stay in the CPU's caches and cost little memory.
BLOCK_BYTES = 4 << 20


class BufferPool:
    """Buffers of `nbytes` (default BLOCK_BYTES) bytes, at most `limit` of them taken at a time.

    `take()` blocks while `limit` buffers are out, so a producer cannot run ahead of its
    consumers by more than `limit` blocks; every buffer taken must be given back.
    """

    def __init__(self, nbytes: int | None = None, limit: int = 4) -> None:
        self.nbytes = BLOCK_BYTES if nbytes is None else nbytes
        self._free: queue.LifoQueue[np.ndarray] = queue.LifoQueue()  # the warmest first
        self._out = threading.BoundedSemaphore(limit)

    def take(self, nbytes: int = 0) -> np.ndarray:
        """A uint8 buffer of at least `nbytes` and `self.nbytes` bytes (contents undefined)."""
        self._out.acquire()
        size = max(nbytes, self.nbytes)
        try:
            buffer = self._free.get_nowait()
        except queue.Empty:
            return np.empty(size, np.uint8)
        return buffer if buffer.size >= size else np.empty(size, np.uint8)

    def give(self, buffer: np.ndarray) -> None:
        """Return a buffer from `take()`."""
        self._free.put(buffer)
        self._out.release()
