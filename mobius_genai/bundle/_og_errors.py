"""How onnxruntime-genai says things that mobius-genai answers differently (read by the smoke
test's process, which imports little, by `run` and by `chat`)."""

from __future__ import annotations

import re

#: How onnxruntime-genai 0.18 says an EP is missing from this build (og.is_webgpu_available()
#: answers True even where ORT lacks WebGPU, so the load error is the reliable signal).
PROVIDER_UNAVAILABLE = re.compile(
    r"not available|not supported in this build|not been built with|Unknown provider name"
    r"|Failed to load library"
)

_LENGTH = (
    "the request is too long: {tokens} new tokens after {current} leave no room to generate "
    "within {limit} tokens (the bundle's context length, or the request's limit); accepted: "
    "fewer tokens in all, or a bundle packaged with a longer --context-length"
)

#: onnxruntime-genai 0.18's words (its exceptions run over several lines: a parser state, an
#: ORT status) → one line saying what was wrong and what is accepted. The first match wins.
ONE_LINE: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"Appending input_tokens_count \((?P<tokens>\d+)\) to current_sequence_length "
            r"\((?P<current>\d+)\) must leave room .* max_session_tokens \((?P<limit>\d+)\)"
        ),
        _LENGTH,
    ),
    (
        re.compile(
            r"input_ids size \((?P<tokens>\d+)\) \+ current sequence length "
            r"\((?P<current>\d+)\) exceeds max length \((?P<limit>\d+)\)"
        ),
        _LENGTH,
    ),
    (
        re.compile(r"Cannot continue a request while an Engine event is pending"),
        "a turn began before the previous turn's events were read; accepted: call "
        "engine.run() until that turn's TURN_FINISHED event (also after cancel_turn), then "
        "begin the next turn",
    ),
    (
        re.compile(r"Error (?:creating grammar|committing tokens): (?P<detail>[^\n<]*)"),
        "guidance refused: {detail}; accepted: a JSON schema, regex or Lark grammar that some "
        "text satisfies",
    ),
    (
        re.compile(r"Unsupported guidance type: (?P<kind>[^\s(]+)"),
        "guidance type {kind!r} is not supported; accepted: json_schema, regex, lark_grammar",
    ),
    (
        re.compile(r"The model type is not supported for decoding"),
        "og.Engine does not run this model type (onnxruntime-genai 0.18 runs plain "
        "decoder-only text models on its Engine); og.Generator runs it",
    ),
    (
        re.compile(r"Engine is no longer healthy\. Cause: (?P<cause>.*?)\s*(?:Please fix|$)", re.S),
        "og.Engine failed and must be created again: {cause}",
    ),
)


def og_error_line(error: BaseException) -> str:
    """One line for an onnxruntime-genai exception: a known message rewritten to say what
    was wrong and what is accepted, else og's first line with its whitespace collapsed."""
    text = str(error)
    for pattern, message in ONE_LINE:
        match = pattern.search(text)
        if match is not None:
            groups = {key: value.strip() for key, value in match.groupdict().items()}
            return " ".join(message.format(**groups).split())
    first = next((line for line in text.splitlines() if line.strip()), type(error).__name__)
    return "onnxruntime-genai: " + " ".join(first.split())
