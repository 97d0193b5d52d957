"""An argparse parser that suggests the closest option or command for a mistyped one.

argparse's own `suggest_on_error` arrives only in Python 3.14; this does the same with difflib
over the options the parser (and the chosen subcommand's parser) were given.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable
from typing import Any

_UNRECOGNIZED = "unrecognized arguments: "


class SuggestingParser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors end with "did you mean X?" when X is close enough.

    Subparsers made by its `add_subparsers` are SuggestingParsers too; the top parser reports
    unknown options (argparse collects them there), so it looks them up among its own options
    and those of the subcommand `chosen` names.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.option_names: list[str] = []  # before argparse's __init__ adds -h
        self.commands: dict[str, SuggestingParser] = {}
        self.chosen: SuggestingParser | None = None
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: object, **kwargs: object) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.option_names.extend(action.option_strings)
        return action

    def add_command(
        self, subparsers: Any, name: str, chosen: bool, **kwargs: object
    ) -> SuggestingParser:
        """`subparsers.add_parser(name, ...)`, remembered for suggestions (`chosen`: the
        command on this command line, whose options unknown ones are compared with)."""
        parser = subparsers.add_parser(name, **kwargs)
        self.commands[name] = parser
        if chosen:
            self.chosen = parser
        return parser

    def error(self, message: str) -> None:  # type: ignore[override]
        super().error(message + self._suggestion(message))

    def _suggestion(self, message: str) -> str:
        if message.startswith(_UNRECOGNIZED):
            known = [*self.option_names, *(self.chosen.option_names if self.chosen else ())]
            words = [w for w in message.removeprefix(_UNRECOGNIZED).split() if w[:1] == "-"]
            return _closest(words, known)
        if "invalid choice: " in message and self.commands:
            word = message.split("invalid choice: ", 1)[1].split("'")[1]
            return _closest([word], self.commands)
        return ""


def _closest(words: Iterable[str], known: Iterable[str]) -> str:
    known = list(known)
    for word in words:
        match = difflib.get_close_matches(word.split("=", 1)[0], known, n=1)
        if match:
            return f"; did you mean {match[0]}?"
    return ""
