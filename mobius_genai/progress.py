"""What long work is doing, on stderr: each phase of building and packaging says so, and the
phases that go tensor by tensor (saving, which reads, converts and quantizes the weights as it
goes) show how far they are.

On a terminal a phase prints a line as it starts, and a counted one a bar; elsewhere (a log, a
CI job) each prints one line when it ends, with its time. Disabled, nothing is printed.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Self

from tqdm import tqdm

PREFIX = "mobius-genai: "


def stderr_line(text: str) -> None:
    """`text` and its newline on stderr in one write. `print` writes them apart, and a Ctrl-C
    handled between the two glued the next line ("…: interrupted; chat ended") onto this one."""
    sys.stderr.write(f"{text}\n")


@contextlib.contextmanager
def phase(description: str, enabled: bool = True) -> Iterator[None]:
    """Say `description` on a terminal as the phase starts, elsewhere with the phase's time
    once it ends ("mobius-genai: optimizing the graph: 2.1 s"); a phase that fails says
    nothing more (its error does). On a terminal, work below that reports how far it is
    (`item_part`: the calibration run's chunks) shows a bar of the phase's fraction done."""
    if not enabled:
        yield
        return
    terminal = sys.stderr.isatty()
    if terminal:
        print(f"{PREFIX}{description}…", file=sys.stderr, flush=True)
    start = time.monotonic()
    with _PhaseBar(description if terminal else None):
        yield
    if not terminal:
        stderr_line(f"{PREFIX}{description}: {time.monotonic() - start:.1f} s")


#: The phases running now, innermost last: work deep below one (in any thread: a weight may
#: be quantized ahead of its turn) reports parts of its current item to it.
_ACTIVE: list[_Listening] = []


class _Listening:
    """A phase that `item_part` reports to while it runs (innermost last), and its bar."""

    _bar: tqdm | None = None

    def part(self, fraction: float) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _ACTIVE.remove(self)
        if self._bar is not None:
            self._bar.close()


class Progress(_Listening):
    """A counted phase: a tqdm bar when enabled and stderr is a terminal; when enabled
    elsewhere, one line saying how much was done and how long it took once the work ends;
    silent when disabled. While it runs, `item_part` moves its bar within the current item."""

    def __init__(self, description: str, total: int, enabled: bool = True) -> None:
        self._bar = None
        self._line = enabled and not sys.stderr.isatty()
        self._description, self._total, self._done = description, total, 0
        self._part = 0.0  # of the current item, shown on the bar before the item is done
        self._start = time.monotonic()
        if enabled and not self._line:
            self._bar = tqdm(total=total, desc=PREFIX + description, unit="tensor", leave=False)

    def advance(self, count: int = 1) -> None:
        self._done += count
        if self._bar is not None:
            self._bar.update(count - self._part)
        self._part = 0.0

    @property
    def position(self) -> float:
        """Items done, plus the part of the current one."""
        return self._done + self._part

    def part(self, fraction: float) -> None:
        """`fraction` (0 to 1) of the current item is done: the bar moves that far into it."""
        fraction = min(max(fraction, self._part), 1.0)
        if self._bar is not None:
            self._bar.update(fraction - self._part)
        self._part = fraction

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        if self._line and exc_info[0] is None:
            print(
                f"{PREFIX}{self._description}: {self._done} of {self._total} tensors, "
                f"{time.monotonic() - self._start:.1f} s",
                file=sys.stderr,
            )


class _PhaseBar(_Listening):
    """The bar of an uncounted phase, shown (on a terminal) once work below reports a part."""

    def __init__(self, description: str | None) -> None:
        self._description, self._bar, self.position = description, None, 0.0

    def part(self, fraction: float) -> None:
        if self._description is None or fraction <= self.position:
            return
        if self._bar is None:
            self._bar = tqdm(
                total=100,
                desc=PREFIX + self._description,
                unit="%",
                leave=False,
                mininterval=0,
                miniters=1,
            )
        self._bar.update(round(100 * fraction) - round(100 * self.position))
        self.position = fraction


def item_part(done: int, total: int) -> None:
    """`done` of the `total` parts of the item the running counted phase is on are done (a
    weight quantized a chunk at a time while it is saved): its bar moves within the item. In
    an uncounted phase the parts are the phase's own (its bar on a terminal); nothing happens
    outside a phase."""
    if _ACTIVE and total > 0:
        _ACTIVE[-1].part(done / total)
