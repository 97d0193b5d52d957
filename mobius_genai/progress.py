"""Progress bars for long work (saving, which reads, converts and quantizes the weights as it
goes), shown only on a terminal."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """A tqdm bar when enabled and stderr is a terminal; otherwise silent."""

    def __init__(self, description: str, total: int, enabled: bool = True) -> None:
        self._bar = None
        if enabled and sys.stderr.isatty():
            self._bar = tqdm(total=total, desc=description, unit="tensor", leave=False)

    def advance(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.close()
