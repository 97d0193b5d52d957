"""GGUF tokenizer metadata → tokenizer.json and tokenizer_config.json (HuggingFace layout).

llama.cpp's `llama` tokenizer model (SentencePiece) is written by `sentencepiece`. Its `gpt2`
tokenizer model is a byte-level BPE: `tokenizer.ggml.tokens` is the
vocabulary (id = index), `merges` the merge list, `token_type` marks control tokens (3) and
user-defined ones (4), which become added tokens. `tokenizer.ggml.pre` names the
pre-tokenizer, one row per name below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.checkpoint.gguf.sentencepiece import sentencepiece_json
from mobius_genai.errors import UnsupportedModelError

__all__ = ["tokenizer_config", "tokenizer_json"]

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def _split(regex: str) -> list[dict[str, Any]]:
    return [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
#: tokenizer.ggml.pre → the HuggingFace pre-tokenizers of that tokenizer.
_PRE_TOKENIZERS: dict[str, list[dict[str, Any]]] = {
    "gpt2": [{**_BYTE_LEVEL, "use_regex": True}],
    "smollm": [
        {"type": "Digits", "individual_digits": True},
        {**_BYTE_LEVEL, "use_regex": True},
    ],
    "llama-bpe": _split(_LLAMA3),
    "qwen2": _split(_QWEN2),
}
_CONTROL, _USER_DEFINED = 3, 4


def _tokenizer_model(meta: Mapping[str, Any], where: str) -> str:
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise UnsupportedModelError(
            f"{where}: tokenizer.ggml.model is {model!r}; accepted: gpt2 (byte-level BPE), "
            "llama (SentencePiece BPE)"
        )
    if model == "llama":
        return model
    pre = meta.get("tokenizer.ggml.pre", "gpt2")
    if pre not in _PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{where}: tokenizer.ggml.pre is {pre!r}; accepted: {', '.join(_PRE_TOKENIZERS)}"
        )
    return model


def tokenizer_json(meta: Mapping[str, Any], where: str) -> dict[str, Any]:
    """tokenizer.json of the GGUF's vocabulary (SentencePiece ones: `sentencepiece`)."""
    if _tokenizer_model(meta, where) == "llama":
        return sentencepiece_json(meta, str(meta.get("general.architecture")))
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    added = [
        {
            "id": index,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": kind == _USER_DEFINED,
            "special": kind == _CONTROL,
        }
        for index, (token, kind) in enumerate(zip(tokens, types, strict=True))
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    pre = _PRE_TOKENIZERS[meta.get("tokenizer.ggml.pre", "gpt2")]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
        "post_processor": {**_BYTE_LEVEL, "use_regex": True},
        "decoder": {**_BYTE_LEVEL, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: index for index, token in enumerate(tokens)},
            "merges": [merge.split(" ", 1) for merge in meta.get("tokenizer.ggml.merges", [])],
        },
    }


def tokenizer_config(meta: Mapping[str, Any], context_length: int | None) -> dict[str, Any]:
    tokens = list(meta["tokenizer.ggml.tokens"])
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
        "add_bos_token": bool(
            meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama")
        ),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        if index is not None and 0 <= int(index) < len(tokens):
            config[f"{role}_token"] = tokens[int(index)]
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    if context_length:
        config["model_max_length"] = context_length
    return config
