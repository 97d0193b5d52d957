"""What a client sees of the tokens generated for it: text pieces, with stop strings cut and tool
calls taken out of the text.

onnxruntime-genai 0.18's Engine refuses per-turn stop strings unless it batches dynamically (a
paged KV cache; CPU bundles batch statically), so the server matches them here, on decoded text:
text that may be the start of a stop string is held back until the next piece decides, and the
text from a stop string on is never sent. Tool calls are told apart by token id (the bundle's
tool-call tokens), never by their text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mobius_genai.serve.tools import ToolCall, ToolTokens, read_call


@dataclass(frozen=True)
class Delta:
    """New text and completed tool calls to send."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.text or self.tool_calls)


class Output:
    """The reply being assembled; `add` each token with its decoded piece, then `finish`."""

    def __init__(self, stops: Sequence[str] = (), tool_tokens: ToolTokens | None = None) -> None:
        self.text = ""
        """The content sent so far."""
        self.tool_calls: list[ToolCall] = []
        self.stopped = False
        """Whether a stop string ended the reply (later tokens are ignored)."""
        self._stops = tuple(stops)
        self._tokens = tool_tokens
        self._held = ""
        self._call: str | None = None

    def add(self, token: int, piece: str) -> Delta:
        """The delta that `token` (decoded as `piece`) adds to the reply."""
        if self.stopped:
            return Delta()
        if self._tokens is not None and token == self._tokens.begin and self._call is None:
            self._call = ""
            return Delta()
        if self._tokens is not None and token == self._tokens.end and self._call is not None:
            text, self._call = self._call, None
            call = read_call(text.strip())
            if call is None:  # not a call after all: the client gets the text
                return self._content(text)
            self.tool_calls.append(call)
            return Delta(tool_calls=(call,))
        if self._call is not None:
            self._call += piece
            return Delta()
        return self._content(piece)

    def finish(self) -> Delta:
        """The text still held when generation ends (a partial stop string, an unclosed call)."""
        text = self._held + (self._call or "")
        self._held, self._call = "", None
        if self.stopped or not text:
            return Delta()
        self.text += text
        return Delta(text)

    def _content(self, piece: str) -> Delta:
        pending = self._held + piece
        found = [(pending.find(stop), stop) for stop in self._stops if stop in pending]
        if found:
            self.stopped = True
            sent, self._held = pending[: min(found)[0]], ""
        else:
            keep = self._partial_stop(pending)
            sent, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        self.text += sent
        return Delta(sent)

    def _partial_stop(self, text: str) -> int:
        """Length of the longest end of `text` that begins a stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if stop.startswith(text[-size:]):
                    longest = size
                    break
        return longest
