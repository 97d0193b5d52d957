"""A request's prompt tokens and its reply budget, checked against the bundle's context.

Chat messages go through the bundle's chat template with onnxruntime-genai's tokenizer, as
`mobius-genai chat` renders them (`bundle.generate.chat_template`, the bos token og leaves out);
a raw completion prompt is encoded as it is. Runs on the engine thread, which owns every
onnxruntime-genai object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnxruntime_genai as og

from mobius_genai.bundle.bos import with_bos
from mobius_genai.serve.protocol import Generation, InputAudio, InputImage, RequestError


@dataclass(frozen=True)
class PromptRules:
    """What a prompt is rendered with and the limits it must keep."""

    template: str | None
    bos: int | None
    context: int
    """Tokens of prompt and reply together (genai_config search.max_length)."""
    max_tokens: int
    """The most tokens a reply may ask for (the server's --max-tokens)."""
    audio_placeholder: str | None = None
    """What a message's clip becomes in its text (None: the bundle takes no clip)."""
    image_placeholder: str | None = None
    """What a message's image becomes in its text (None: the bundle takes no image)."""


def prompt_ids(text: str, tokenizer: og.Tokenizer, rules: PromptRules) -> list[int]:
    """The token ids of a rendered prompt."""
    return with_bos(tokenizer.encode(text), rules.bos)


def prompt_text(generation: Generation, tokenizer: og.Tokenizer, rules: PromptRules) -> str:
    """The prompt, a chat's messages rendered with the bundle's template (each clip and image
    as the bundle's placeholder); a RequestError when the template refuses the messages."""
    text = generation.prompt
    if generation.messages is not None:
        if rules.template is None:
            raise RequestError(
                "this bundle has no chat template; accepted: POST /v1/completions with a prompt",
                param="messages",
            )
        tools = generation.tools if generation.tool_choice.mode != "none" else ()
        messages = [_placed(message, rules) for message in generation.messages]
        try:
            text = rendered(tokenizer, rules.template, messages, tools)
        except RuntimeError as error:  # og's error for a template that raises on the messages
            raise RequestError(
                f"the bundle's chat template cannot render these messages: {error}",
                param="messages",
            ) from None
    return text


def _placed(message: Mapping[str, Any], rules: PromptRules) -> Mapping[str, Any]:
    """`message` with its text parts, clips and images (protocol's content tuple) as one text,
    each clip and image as the bundle's placeholder."""
    content = message["content"]
    if not isinstance(content, tuple):
        return message
    pieces = []
    for part in content:
        placeholder = part if isinstance(part, str) else _placeholder(part, rules)
        if placeholder is None:  # BundleMedia.check refuses such a request before it is queued
            raise RequestError("this bundle takes no such media", param=part.where)
        pieces.append(placeholder)
    return {**message, "content": "".join(pieces)}


def _placeholder(part: InputAudio | InputImage, rules: PromptRules) -> str | None:
    return rules.image_placeholder if isinstance(part, InputImage) else rules.audio_placeholder


def rendered(
    tokenizer: og.Tokenizer,
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The text of `messages` (OpenAI's role/content dicts) and `tools` through the chat
    `template` with onnxruntime-genai's tokenizer, ending with the assistant's turn opened."""
    return tokenizer.apply_chat_template(
        json.dumps(list(messages)),
        template_str=template,
        tools=json.dumps(list(tools)) if tools else None,
        add_generation_prompt=True,
    )


def reply_budget(generation: Generation, prompt_tokens: int, rules: PromptRules) -> int:
    """Tokens the reply may take: max_tokens if given, else all the context leaves (up to the
    server's limit); a RequestError when the prompt and the reply do not fit."""
    asked = generation.max_tokens
    if asked is not None and asked > rules.max_tokens:
        raise RequestError(
            f"max_tokens {asked} is above this server's limit of {rules.max_tokens}",
            param="max_tokens",
        )
    room = rules.context - prompt_tokens
    budget = min(rules.max_tokens, room) if asked is None else asked
    if room < 1 or budget > room:
        what = "messages" if generation.messages is not None else "prompt"
        raise RequestError(
            f"This model's maximum context length is {rules.context} tokens. However, you "
            f"requested {prompt_tokens + max(budget, 1)} tokens ({prompt_tokens} in the {what}, "
            f"{max(budget, 1)} in the completion). Please reduce the length of the {what} or "
            "completion.",
            param=what,
            code="context_length_exceeded",
        )
    return budget
