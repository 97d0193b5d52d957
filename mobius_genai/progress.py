"""Progress of long work (saving, which reads, converts and quantizes the weights as it goes):
a bar on a terminal, one line when the work is done elsewhere (a log)."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """A tqdm bar when enabled and stderr is a terminal; when enabled elsewhere, one line
    saying how much was done once the work ends; silent when disabled."""

    def __init__(self, description: str, total: int, enabled: bool = True) -> None:
        self._bar = None
        self._line = enabled and not sys.stderr.isatty()
        self._description, self._total, self._done = description, total, 0
        if enabled and not self._line:
            self._bar = tqdm(total=total, desc=description, unit="tensor", leave=False)

    def advance(self, count: int = 1) -> None:
        self._done += count
        if self._bar is not None:
            self._bar.update(count)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._line and exc_info[0] is None:
            print(
                f"mobius-genai: {self._description}: {self._done} of {self._total} tensors",
                file=sys.stderr,
            )
