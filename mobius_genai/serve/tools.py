"""Tool calls and structured output: the bundle's tool-call tokens, the guidance grammar a request
gets (onnxruntime-genai's llguidance), and a generated call read back as OpenAI's `tool_calls`.

A bundle that can call tools says so in genai_config.json: ``model.bot_token_id`` and
``model.eot_token_id``, the tokens that open and close a call (``<tool_call>`` and
``</tool_call>`` in Qwen's and Hermes' templates; onnxruntime-genai's builder writes the same
keys). Between them the model writes ``{"name": ..., "arguments": {...}}``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mobius_genai.serve.protocol import Generation, RequestError

#: Compact JSON under guidance: no whitespace the model may repeat until max_tokens.
_COMPACT = {"whitespace_flexible": False}


@dataclass(frozen=True)
class ToolTokens:
    """The token ids that open (`begin`) and close (`end`) a tool call."""

    begin: int
    end: int


@dataclass(frozen=True)
class ToolCall:
    """One call as OpenAI returns it: `arguments` is a JSON string."""

    id: str
    name: str
    arguments: str


def tool_tokens(genai_config: Mapping[str, Any]) -> ToolTokens | None:
    """The bundle's tool-call tokens, None unless both ids are set and inside the vocabulary."""
    model = genai_config.get("model", {})
    ids = (model.get("bot_token_id"), model.get("eot_token_id"))
    vocab = model.get("vocab_size")
    if not all(isinstance(i, int) and i >= 0 and (vocab is None or i < vocab) for i in ids):
        return None
    return ToolTokens(*ids)


def guidance(generation: Generation, tokens: ToolTokens | None) -> tuple[str, str] | None:
    """(onnxruntime-genai guidance type, data) for the request, None when it is unguided: a
    forced tool call becomes a grammar, a response_format a JSON schema."""
    choice = generation.tool_choice
    if generation.tools and tokens is None:
        raise RequestError(
            "tools: this bundle cannot call tools (its genai_config.json has no "
            "model.bot_token_id / model.eot_token_id); accepted: a request without tools",
            param="tools",
        )
    if choice.mode == "required" and not generation.tools:
        raise RequestError("tool_choice asks for a tool call but no tools are given", param="tools")
    if choice.mode == "required" and generation.response_format is not None:
        raise RequestError(
            "response_format cannot be combined with a forced tool_choice",
            param="response_format",
        )
    if choice.mode == "required":
        return "lark_grammar", _call_grammar(generation.tools, choice.name, tokens)
    if generation.response_format is not None:
        return "json_schema", json.dumps(_compact(generation.response_format))
    return None


def read_call(text: str) -> ToolCall | None:
    """The call the model wrote between the tool-call tokens, None when it is not
    ``{"name": ..., "arguments": ...}``."""
    try:
        call = json.loads(text)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(f"call_{secrets.token_hex(12)}", call["name"], arguments)


def _call_grammar(tools: Sequence[Mapping[str, Any]], name: str | None, tokens: ToolTokens) -> str:
    """A lark grammar: the begin token, one call of a given tool (of `name` when named), the
    end token."""
    functions = [tool["function"] for tool in tools]
    if name is not None:
        functions = [function for function in functions if function["name"] == name]
        if not functions:
            raise RequestError(
                f"tool_choice names the function {name!r}, which is not among the tools",
                param="tool_choice",
            )
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function["name"]},
                "arguments": function.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for function in functions
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return f"start: <[{tokens.begin}]> call <[{tokens.end}]>\ncall: %json {json.dumps(_compact(schema))}"


def _compact(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with llguidance's compact-JSON setting, unless it sets its own."""
    return {"x-guidance": _COMPACT, **schema}
