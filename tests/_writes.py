"""A text stream that keeps each write apart: what a command had printed after each step
(`run`'s tokens, chat's status lines), where capsys only gives the whole text."""

from __future__ import annotations

import io


class Writes(io.StringIO):
    """A StringIO that also records every write in `writes`."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)
