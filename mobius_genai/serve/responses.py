"""Response bodies in OpenAI's shapes: chat completions and their stream chunks, text
completions and theirs, usage, errors."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from mobius_genai.serve.output import Delta
from mobius_genai.serve.protocol import RequestError
from mobius_genai.serve.tools import ToolCall


def error_body(error: RequestError) -> dict[str, Any]:
    """OpenAI's error object."""
    return {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": error.code,
        }
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage: tokens of the prompt as fed, tokens generated (end-of-sequence not
    counted), and their sum."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Reply:
    """The id, model and time every body of one response shares; `chat` picks the chat
    completion shapes, otherwise the text completion ones."""

    def __init__(self, model: str, chat: bool) -> None:
        self.chat = chat
        prefix = "chatcmpl" if chat else "cmpl"
        self._head = {
            "id": f"{prefix}-{secrets.token_hex(12)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def whole(
        self, text: str, tool_calls: Sequence[ToolCall], reason: str, counts: dict[str, int]
    ) -> dict[str, Any]:
        """The non-streamed response."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["content"] = text or None
                message["tool_calls"] = [_call(call) for call in tool_calls]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {**self._head, "choices": [choice], "usage": counts}

    def opening(self) -> dict[str, Any] | None:
        """The chunk a chat stream starts with (the role), None for a text completion."""
        return self._chunk({"role": "assistant", "content": ""}) if self.chat else None

    def delta(self, delta: Delta, first_call: int) -> dict[str, Any]:
        """The chunk of `delta`; its tool calls are numbered from `first_call`."""
        if not self.chat:
            return self._chunk(delta.text)
        body: dict[str, Any] = {}
        if delta.text:
            body["content"] = delta.text
        if delta.tool_calls:
            body["tool_calls"] = [
                _call(call, first_call + i) for i, call in enumerate(delta.tool_calls)
            ]
        return self._chunk(body)

    def closing(self, reason: str) -> dict[str, Any]:
        """The last chunk with a choice: no new content, the finish reason."""
        return self._chunk({} if self.chat else "", reason)

    def usage_chunk(self, counts: dict[str, int]) -> dict[str, Any]:
        """The chunk stream_options.include_usage asks for: no choices, the usage."""
        return {**self._stream_head(), "choices": [], "usage": counts}

    def _chunk(self, content: dict[str, Any] | str, reason: str | None = None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": content, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": reason}
        return {**self._stream_head(), "choices": [choice]}

    def _stream_head(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head, "object": kind}


def _call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    return body if index is None else {"index": index, **body}
