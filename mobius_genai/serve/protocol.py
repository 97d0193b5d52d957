"""OpenAI request bodies (chat completions, completions) checked and turned into a `Generation`.

Every field the server understands has a row in a table; a field outside the tables, a value of
the wrong type or range, or an OpenAI option the server does not implement (``n`` above 1,
``logprobs``) is a `RequestError` naming the field and what is accepted, which the app sends as a
400 in OpenAI's error shape. Nothing here touches onnxruntime-genai.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mobius_genai.serve.content_parts import InputAudio, InputImage, image_url, input_audio
from mobius_genai.serve.request_error import RequestError

#: OpenAI's limit on stop sequences per request.
MAX_STOP_STRINGS = 4
#: A transcription's response formats (OpenAI's), and those with times.
TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TIMED_FORMATS = ("srt", "vtt", "verbose_json")
#: The form field the openai client sends timestamp granularities as (repeated per value).
_GRANULARITIES = "timestamp_granularities[]"
#: Roles a chat message may have; developer is OpenAI's newer name for system.
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


@dataclass(frozen=True)
class Sampling:
    """Sampling asked for; None leaves the bundle's own search settings."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    @property
    def do_sample(self) -> bool | None:
        """True or False when the request decides between sampling and greedy, else None."""
        if self.temperature == 0:
            return False
        if self.temperature is not None or self.top_p is not None:
            return True
        return None


@dataclass(frozen=True)
class ToolChoice:
    """`mode` is none, auto or required; `name` the one function a named choice forces."""

    mode: str = "auto"
    name: str | None = None


@dataclass(frozen=True)
class Generation:
    """What one request asks for: a chat (`messages`) or a raw `prompt`, and its options."""

    messages: tuple[dict[str, Any], ...] | None = None
    prompt: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    response_format: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    stream: bool = False
    include_usage: bool = False

    @property
    def clips(self) -> tuple[InputAudio, ...]:
        """The messages' audio parts, in order."""
        return tuple(part for part in self.parts if isinstance(part, InputAudio))

    @property
    def images(self) -> tuple[InputImage, ...]:
        """The messages' image parts, in order."""
        return tuple(part for part in self.parts if isinstance(part, InputImage))

    @property
    def parts(self) -> tuple[str | InputAudio | InputImage, ...]:
        """The content parts of the messages that have media, in order."""
        return tuple(
            part
            for message in self.messages or ()
            if isinstance(message["content"], tuple)
            for part in message["content"]
        )


@dataclass(frozen=True)
class Transcription:
    """What a POST /v1/audio/transcriptions (or /translations: `task` translate) form asks
    for: its audio file's bytes, the spoken language (None: the model's default, detected for
    a translation), the response's format, a previous-text prompt, the sampling temperature
    (0: greedy) and the timestamp granularities (segment only)."""

    audio: bytes
    model: str | None = None
    language: str | None = None
    response_format: str = "json"
    task: str = "transcribe"
    prompt: str | None = None
    temperature: float = 0.0
    timestamp_granularities: tuple[str, ...] = ()

    @property
    def timestamps(self) -> bool:
        """Whether the format shows times (the model then decodes with timestamps)."""
        return self.response_format in TIMED_FORMATS


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; a RequestError for anything else."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError(
            f"the request body is not valid JSON ({error}); accepted: a JSON object"
        ) from None
    except RecursionError:
        raise RequestError("the request body is JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError(
            f"the request body is a JSON {type(body).__name__}; accepted: a JSON object"
        )
    return body


def chat_request(body: Mapping[str, Any]) -> Generation:
    """The Generation of a POST /v1/chat/completions body."""
    values = _checked(body, _CHAT_FIELDS, "chat completion")
    if "messages" not in values:
        raise RequestError("messages is required: a list of chat messages", param="messages")
    max_tokens = values.get("max_completion_tokens", values.get("max_tokens"))
    return Generation(
        messages=values["messages"],
        max_tokens=max_tokens,
        **_common(values),
        response_format=values.get("response_format"),
        tools=values.get("tools", ()),
        tool_choice=values.get("tool_choice", ToolChoice("auto" if "tools" in values else "none")),
    )


def completion_request(body: Mapping[str, Any]) -> Generation:
    """The Generation of a POST /v1/completions body (OpenAI's default max_tokens is 16)."""
    values = _checked(body, _COMPLETION_FIELDS, "completion")
    if "prompt" not in values:
        raise RequestError("prompt is required: a string", param="prompt")
    return Generation(
        prompt=values["prompt"], max_tokens=values.get("max_tokens", 16), **_common(values)
    )


def transcription_request(
    fields: Mapping[str, Any], audio: bytes | None, task: str = "transcribe"
) -> Transcription:
    """The Transcription of a form's text `fields` and its `file` (None: not sent); `task`
    translate reads a /v1/audio/translations form (no language, no granularities)."""
    transcribe = task == "transcribe"
    table = _TRANSCRIPTION_FIELDS if transcribe else _TRANSLATION_FIELDS
    values = _checked(fields, table, "transcription" if transcribe else "translation")
    if not audio:
        raise RequestError(
            "file is required; accepted: the audio file (WAV, FLAC or MP3) as the "
            "multipart/form-data part `file`",
            param="file",
        )
    response_format = values.get("response_format", "json")
    granularities = values.get(_GRANULARITIES, ())
    if granularities and response_format != "verbose_json":
        raise RequestError(
            f"{_GRANULARITIES} needs response_format verbose_json, got {response_format}; "
            "accepted: response_format verbose_json with it",
            param=_GRANULARITIES,
        )
    return Transcription(
        audio,
        model=values.get("model"),
        language=values.get("language"),
        response_format=response_format,
        task=task,
        prompt=values.get("prompt"),
        temperature=values.get("temperature", 0.0),
        timestamp_granularities=granularities,
    )


def _common(values: Mapping[str, Any]) -> dict[str, Any]:
    sampling = Sampling(values.get("temperature"), values.get("top_p"), values.get("seed"))
    options = values.get("stream_options", {})
    if options and not values.get("stream"):
        raise RequestError(
            "stream_options is only accepted with stream: true", param="stream_options"
        )
    return {
        "model": values.get("model"),
        "sampling": sampling,
        "stop": values.get("stop", ()),
        "stream": values.get("stream", False),
        "include_usage": bool(options.get("include_usage", False)),
    }


def _checked(
    body: Mapping[str, Any], fields: Mapping[str, Callable[[str, Any], Any]], what: str
) -> dict[str, Any]:
    """Each field's checked value; null counts as absent, as OpenAI treats it."""
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise RequestError(
            f"unrecognized {what} argument(s): {', '.join(unknown)}; accepted: "
            f"{', '.join(sorted(fields))}",
            param=unknown[0],
        )
    return {name: fields[name](name, value) for name, value in body.items() if value is not None}


# ---- field checks: each takes (name, value) and returns the value to use --------------------


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string, got {_kind(value)}", param=name)
    return value


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false, got {_kind(value)}", param=name)
    return value


def _integer(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(f"{name} must be an integer >= {low}, got {value!r}", param=name)
    return value


def _number(name: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if (
        number is None
        or not math.isfinite(number)
        or not low <= number <= high
        or (low_open and number == low)
    ):
        bound = f"{low} < {name} <= {high}" if low_open else f"{low} <= {name} <= {high}"
        raise RequestError(f"{name} must be a number with {bound}, got {value!r}", param=name)
    return float(number)


def _only(accepted: Any) -> Callable[[str, Any], Any]:
    """A field the server accepts only at OpenAI's default value (it does not implement it)."""

    def check(name: str, value: Any) -> Any:
        if value != accepted:
            raise RequestError(
                f"{name} {json.dumps(value)} is not supported by this server; accepted: "
                f"{json.dumps(accepted)} (or leave it out)",
                param=name,
            )
        return value

    return check


def _choice(*accepted: str) -> Callable[[str, Any], str]:
    """A form field that takes one of `accepted`."""

    def check(name: str, value: Any) -> str:
        if value not in accepted:
            raise RequestError(
                f"{name} {json.dumps(value)} is not supported by this server; accepted: "
                f"{', '.join(accepted)}",
                param=name,
            )
        return value

    return check


def _form_temperature(name: str, value: Any) -> float:
    """A form's temperature, 0 to 1 as OpenAI takes it (0: greedy)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    return _number(name, number if math.isfinite(number) else value, 0.0, 1.0)


def _granularities(name: str, value: Any) -> tuple[str, ...]:
    """timestamp_granularities[]: segment; word timestamps are not computed here."""
    values = tuple(value) if isinstance(value, list) else (value,)
    for one in values:
        if one != "segment":
            said = "word timestamps are not implemented" if one == "word" else "not accepted"
            raise RequestError(f"{name} {json.dumps(one)}: {said}; accepted: segment", param=name)
    return values


def _ignored(name: str, value: Any) -> Any:
    return value


def _stop(name: str, value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or not 0 < len(stops) <= MAX_STOP_STRINGS
        or not all(isinstance(stop, str) and stop for stop in stops)
    ):
        raise RequestError(
            f"stop must be a non-empty string or a list of 1 to {MAX_STOP_STRINGS} of them, "
            f"got {_kind(value)}",
            param=name,
        )
    return tuple(stops)


def _stream_options(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) - {"include_usage"}:
        raise RequestError(
            f"{name} must be an object with include_usage (true or false)", param=name
        )
    return {"include_usage": _boolean(f"{name}.include_usage", value.get("include_usage", False))}


def _prompt(name: str, value: Any) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if not isinstance(value, str):
        raise RequestError(
            f"{name} must be a string (or a list of one string), got {_kind(value)}", param=name
        )
    return value


def _messages(name: str, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise RequestError(
            f"{name} must be a non-empty list of messages, got {_kind(value)}", param=name
        )
    return tuple(_message(f"{name}[{i}]", message) for i, message in enumerate(value))


def _message(where: str, message: Any) -> dict[str, Any]:
    """The message as a chat template reads it: its role, text content, tool calls."""
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object, got {_kind(message)}", param=where)
    role = message.get("role")
    if role not in _ROLES:
        raise RequestError(
            f"{where}.role {role!r} is not accepted; accepted: {', '.join(_ROLES)}", param=where
        )
    rendered: dict[str, Any] = {"role": _ROLES[role], "content": _content(where, message)}
    for key in ("name", "tool_call_id"):
        if isinstance(message.get(key), str):
            rendered[key] = message[key]
    if role == "assistant" and message.get("tool_calls"):
        rendered["tool_calls"] = _history_calls(f"{where}.tool_calls", message["tool_calls"])
    elif message.get("content") is None:
        raise RequestError(f"{where}.content is required", param=f"{where}.content")
    return rendered


def _content(
    where: str, message: Mapping[str, Any]
) -> str | tuple[str | InputAudio | InputImage, ...]:
    """The message's text; with audio or image parts, its text parts, clips and images in
    order (the engine puts the bundle's placeholder where each clip or image is)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(
            f"{where}.content must be a string or a list of content parts, got {_kind(content)}",
            param=f"{where}.content",
        )
    parts = [_part(f"{where}.content[{i}]", part) for i, part in enumerate(content)]
    texts = [part for part in parts if isinstance(part, str)]
    return "".join(texts) if len(texts) == len(parts) else tuple(parts)


def _part(where: str, part: Any) -> str | InputAudio | InputImage:
    """A text part's text, an input_audio part's clip or an image_url part's image."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return part["text"]
    if kind == "input_audio":
        return input_audio(f"{where}.input_audio", part.get("input_audio"))
    if kind == "image_url":
        return image_url(where, part.get("image_url"))
    raise RequestError(
        f"{where} of type {json.dumps(kind)} is not served; accepted: a text part ({{'type': "
        "'text', 'text': ...}), an image part ({'type': 'image_url', 'image_url': {'url': "
        "'data:image/png;base64,...'}}) or an audio part ({'type': 'input_audio', "
        "'input_audio': {'data': <base64>, 'format': 'wav'}})",
        param=where,
    )


def _history_calls(where: str, calls: Any) -> list[dict[str, Any]]:
    """An assistant turn's earlier tool calls, arguments as objects (what templates expect)."""
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list", param=where)
    rendered = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(
                f"{where}: each call needs function.name and function.arguments", param=where
            )
        arguments = function.get("arguments", "{}")
        with contextlib.suppress(ValueError):  # else kept as the text the client sent
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        rendered.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return rendered


def _tools(name: str, value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise RequestError(f"{name} must be a list of tools, got {_kind(value)}", param=name)
    tools = []
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("parameters", {}), dict)
        ):
            raise RequestError(
                f"{name}[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'parameters': {JSON schema}}}}",
                param=f"{name}[{i}]",
            )
        tools.append({"type": "function", "function": dict(function)})
    return tuple(tools)


def _tool_choice(name: str, value: Any) -> ToolChoice:
    if value in ("none", "auto", "required"):
        return ToolChoice(value)
    function = value.get("function") if isinstance(value, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return ToolChoice("required", function["name"])
    raise RequestError(
        f"{name} {json.dumps(value)} is not accepted; accepted: none, auto, required or "
        "{'type': 'function', 'function': {'name': ...}}",
        param=name,
    )


def _response_format(name: str, value: Any) -> dict[str, Any] | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    schema = value.get("json_schema") if kind == "json_schema" else None
    if isinstance(schema, dict) and isinstance(schema.get("schema", {}), dict):
        return schema.get("schema", {})
    raise RequestError(
        f"{name} {json.dumps(value)} is not accepted; accepted: {{'type': 'text'}}, "
        "{'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {'name': ..., "
        "'schema': {...}}}",
        param=name,
    )


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


_SHARED_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "model": _string,
    "max_tokens": lambda name, value: _integer(name, value, 1),
    "temperature": lambda name, value: _number(name, value, 0.0, 2.0),
    "top_p": lambda name, value: _number(name, value, 0.0, 1.0, low_open=True),
    "seed": lambda name, value: _integer(name, value, 0),
    "stop": _stop,
    "n": _only(1),
    "stream": _boolean,
    "stream_options": _stream_options,
    "user": _ignored,
    "frequency_penalty": _only(0),
    "presence_penalty": _only(0),
    "logit_bias": _only({}),
}
_CHAT_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    **_SHARED_FIELDS,
    "messages": _messages,
    "max_completion_tokens": lambda name, value: _integer(name, value, 1),
    "response_format": _response_format,
    "tools": _tools,
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _boolean,
    "logprobs": _only(False),
    "metadata": _ignored,
    "store": _only(False),
}
_COMPLETION_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    **_SHARED_FIELDS,
    "prompt": _prompt,
    "echo": _only(False),
    "best_of": _only(1),
    "suffix": _only(None),
}
#: A transcription form's text fields (its `file` is read apart).
_TRANSLATION_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "model": _string,
    "response_format": _choice(*TRANSCRIPT_FORMATS),
    "temperature": _form_temperature,
    "prompt": _string,
}
_TRANSCRIPTION_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    **_TRANSLATION_FIELDS,
    "language": _string,
    _GRANULARITIES: _granularities,
    "stream": _choice("false"),
}
