"""GGUF SentencePiece tokenizers (tokenizer.ggml.model "llama") → tokenizer.json.

llama.cpp stores a SentencePiece BPE vocabulary: `tokens` (id = index), `scores`, `token_type`
(3 control, 4 user-defined, 6 byte pieces <0x00> ...) and usually no `merges`. The
tokenizer.json written here is the one transformers' GGUF loader builds
(integrations/gguf/gguf_tokenizer_mapping.py): a BPE with byte fallback whose merges are the
file's, else every split of a token into two known pieces ranked by the token's score (gemma:
by its place in the vocabulary, and its all-space tokens spelled with ▁), and per architecture
SentencePiece's whitespace handling: llama's Metaspace (▁ before the first piece), phi3's
normalizer (▁ prepended, spaces → ▁), gemma's (spaces → ▁, split after each, no prefix).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["sentencepiece_json"]

_SPACE = "\u2581"
_CONTROL, _USER_DEFINED = 3, 4


def _replace(pattern: str, content: str) -> dict[str, Any]:
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


_DECODER = [_replace(_SPACE, " "), {"type": "ByteFallback"}, {"type": "Fuse"}]
_STRIP = {"type": "Strip", "content": " ", "start": 1, "stop": 0}

#: architecture → (normalizer, pre_tokenizer, decoder, unk token in the BPE model, merges by
#: vocabulary order); others get llama's.
_WHITESPACE: dict[str, tuple[Any, Any, list[dict[str, Any]], bool, bool]] = {
    "llama": (
        None,
        {"type": "Metaspace", "replacement": _SPACE, "prepend_scheme": "first", "split": False},
        [*_DECODER, _STRIP],
        False,
        False,
    ),
    "phi3": (
        {
            "type": "Sequence",
            "normalizers": [{"type": "Prepend", "prepend": _SPACE}, _replace(" ", _SPACE)],
        },
        None,
        [*_DECODER, _STRIP],
        False,
        False,
    ),
    "gemma3": (
        _replace(" ", _SPACE),
        {
            "type": "Split",
            "pattern": {"String": " "},
            "behavior": "MergedWithPrevious",
            "invert": False,
        },
        _DECODER,
        True,
        True,
    ),
}


def _merges(tokens: list[str], scores: Mapping[str, float]) -> list[list[str]]:
    """Every (left, right) split of a token into two vocabulary pieces, the best-scored token
    first (transformers' `generate_merges`)."""
    vocab = {token: index for index, token in enumerate(tokens)}
    found = []
    for token, score in scores.items():
        local = [
            (token[:cut], token[cut:], score)
            for cut in range(1, len(token))
            if token[:cut] in vocab and token[cut:] in vocab
        ]
        found += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[left, right] for left, right, _ in found]


def _post_processor(meta: Mapping[str, Any], tokens: list[str]) -> dict[str, Any] | None:
    """BOS / EOS added around each sequence as tokenizer.ggml.add_bos_token / add_eos_token
    say (a SentencePiece vocabulary adds BOS unless it says otherwise, as llama.cpp does)."""
    added = []
    for role, default in (("bos", True), ("eos", False)):
        index = meta.get(f"tokenizer.ggml.{role}_token_id")
        if meta.get(f"tokenizer.ggml.add_{role}_token", default) and index is not None:
            added.append((role, tokens[int(index)], int(index)))
    if not added:
        return None

    def template(sequence: str, type_id: int) -> list[dict[str, Any]]:
        special = {
            role: {"SpecialToken": {"id": token, "type_id": type_id}} for role, token, _ in added
        }
        body = {"Sequence": {"id": sequence, "type_id": type_id}}
        return [part for part in (special.get("bos"), body, special.get("eos")) if part]

    return {
        "type": "TemplateProcessing",
        "single": template("A", 0),
        "pair": template("A", 0) + template("B", 1),
        "special_tokens": {
            token: {"id": token, "ids": [index], "tokens": [token]} for _, token, index in added
        },
    }


def sentencepiece_json(meta: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The tokenizer.json of a GGUF's SentencePiece vocabulary for architecture `arch`."""
    normalizer, pre_tokenizer, decoder, with_unk, by_order = _WHITESPACE.get(
        arch, _WHITESPACE["llama"]
    )
    tokens = list(meta["tokenizer.ggml.tokens"])
    if by_order:  # gemma: all-space tokens are stored as spaces, looked up as ▁
        tokens = [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if meta.get("tokenizer.ggml.merges"):
        merges = [merge.split(" ", 1) for merge in meta["tokenizer.ggml.merges"]]
    elif by_order:
        merges = _merges(tokens, {token: -index for index, token in enumerate(tokens)})
    else:
        merges = _merges(tokens, dict(zip(tokens, meta["tokenizer.ggml.scores"], strict=True)))
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": index,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": kind == _CONTROL,
            }
            for index, (token, kind) in enumerate(zip(tokens, types, strict=True))
            if kind in (_CONTROL, _USER_DEFINED)
        ],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(meta, tokens),
        "decoder": {"type": "Sequence", "decoders": decoder},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokens[int(unk)] if with_unk and unk is not None else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {token: index for index, token in enumerate(tokens)},
            "merges": merges,
        },
    }
