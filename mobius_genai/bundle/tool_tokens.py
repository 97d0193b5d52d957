"""The tool-call and reasoning token ids of genai_config.json, from the tokenizer's vocabulary.

onnxruntime-genai 0.18 reads four optional ids in `model` (src/config.cpp): `bot_token_id` /
`eot_token_id` (begin / end of a tool call) and `bor_token_id` / `eor_token_id` (begin / end
of reasoning). Its builder (`add_special_token_ids` in onnxruntime_genai/models/builder.py)
writes each from the first of its spellings found in the tokenizer's whole vocabulary
(`get_vocab()`: the model's vocabulary and every added token, special or not); so does this
module, reading the tokenizer files without transformers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json
from mobius_genai.errors import BundleError

#: genai_config `model` key → the token spellings that stand for it, in the builder's order.
TOOL_TOKENS: Mapping[str, tuple[str, ...]] = {
    "bot_token_id": ("<tool_call>", "<|tool_call|>"),
    "eot_token_id": ("</tool_call>", "<|/tool_call|>"),
    "bor_token_id": ("<think>",),
    "eor_token_id": ("</think>",),
}


def vocabulary(folder: str | Path) -> dict[str, int]:
    """token → id over the tokenizer files in `folder`: tokenizer.json's model vocabulary
    (a BPE / WordPiece map or a Unigram list) and added tokens, tokenizer_config.json's
    `added_tokens_decoder`, or vocab.json; {} for a SentencePiece-only tokenizer."""
    folder = Path(folder)
    tokens: dict[str, int] = {}
    for name, pairs in (
        ("vocab.json", _map_pairs),
        ("tokenizer.json", _tokenizer_json_pairs),
        ("tokenizer_config.json", _tokenizer_config_pairs),
    ):
        if (folder / name).is_file():
            for token, token_id in pairs(read_json(folder / name, BundleError, name)):
                if isinstance(token, str) and isinstance(token_id, int):
                    tokens[token] = token_id
    return tokens


def tool_token_ids(folder: str | Path) -> dict[str, int]:
    """The TOOL_TOKENS keys whose token the tokenizer in `folder` has, with its id."""
    tokens = vocabulary(folder)
    found = {}
    for key, spellings in TOOL_TOKENS.items():
        token = next((spelling for spelling in spellings if spelling in tokens), None)
        if token is not None:
            found[key] = tokens[token]
    return found


def check_tool_token_ids(model: Mapping[str, Any], folder: str | Path) -> list[str]:
    """Problems of genai_config `model`'s tool-call and reasoning ids against the tokenizer in
    `folder`: an id that is not the tokenizer's id of that token."""
    written = {key: model[key] for key in TOOL_TOKENS if key in model}
    if not written:
        return []
    tokens = vocabulary(folder)
    if not tokens:
        return []  # a SentencePiece model: nothing to read it with here
    expected = tool_token_ids(folder)
    return [
        f"model.{key}: {value!r} is not the tokenizer's id of "
        f"{' or '.join(repr(s) for s in TOOL_TOKENS[key])} "
        + (f"({expected[key]})" if key in expected else "(the tokenizer has none of them)")
        for key, value in written.items()
        if expected.get(key) != value
    ]


def _map_pairs(document: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(document, dict):
        yield from document.items()


def _tokenizer_json_pairs(document: Any) -> Iterator[tuple[Any, Any]]:
    if not isinstance(document, dict):
        return
    model = document.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        yield from vocab.items()
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the index
        for index, entry in enumerate(vocab):
            if isinstance(entry, list) and entry:
                yield entry[0], index
    added = document.get("added_tokens")
    for entry in added if isinstance(added, list) else []:
        if isinstance(entry, dict):
            yield entry.get("content"), entry.get("id")


def _tokenizer_config_pairs(document: Any) -> Iterator[tuple[Any, Any]]:
    decoder = document.get("added_tokens_decoder") if isinstance(document, dict) else None
    for key, entry in decoder.items() if isinstance(decoder, dict) else []:
        if isinstance(entry, dict) and key.isdigit():
            yield entry.get("content"), int(key)
