"""Config values rows read from one config.json switch or number (FamilyAdapter.config_defaults
and config_overrides): generic readers of one key, and the family reads of that kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import UnsupportedModelError


def positive_number(key: str) -> Callable[[Mapping[str, Any]], float]:
    """An override: the positive number `key` of config.json, 1.0 when absent."""
    return lambda raw: fields.number(raw.get(key), key, 1.0, positive=True)


def switch(key: str, default: bool) -> Callable[[Mapping[str, Any]], bool]:
    """An override: the true/false field `key` of config.json, `default` when absent."""
    return lambda raw: fields.flag(raw.get(key), key, default)


def optional_positive(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    """An override: the positive number `key` of config.json, None when absent or null."""
    return lambda raw: fields.number(raw.get(key), key, positive=True)


def when_absent(key: str, value: Any) -> Callable[[Mapping[str, Any]], Any]:
    """A default for configs whose class fills an absent `key` with `value` but keeps an
    explicit null (which config parsing resolves: hidden_size / heads, one kv head per head)."""
    return lambda raw: None if key in raw else value


def internlm3_bias(raw: Mapping[str, Any]) -> bool:
    """InternLM3 runs as llama: one bias switch for q, k, v and o, and one for the MLP; the
    transformers config refuses them differing, and so does this package."""
    attention = fields.flag(raw.get("attention_bias"), "attention_bias", False)
    mlp = fields.flag(raw.get("mlp_bias"), "mlp_bias", False)
    if attention != mlp:
        raise UnsupportedModelError(
            f"config.json: qkv_bias (attention_bias) is {attention} and bias (mlp_bias) is {mlp}; "
            "internlm3 models are supported only with both equal, as transformers runs them"
        )
    return attention


def gemma_activation(raw: Mapping[str, Any]) -> str:
    """gemma2/3 MLPs use `hidden_activation` (hub configs may also carry a `hidden_act`)."""
    return raw.get("hidden_activation") or "gelu_pytorch_tanh"
