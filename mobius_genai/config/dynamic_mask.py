"""Doge's dynamic mask attention (SmallDoge): each key gets a bias from its value states,
dt = exp(A * softplus(dt_proj(v))) per key/value head, added to the scores of every query
head of its group; past `keep_window_size` keys a query keeps only those with the largest
biases (transformers' `prepare_dynamic_mask`).

components/dynamic_mask.py computes it; this section holds the window and whether dt_proj
has a bias (Doge's `attention_bias`, which also gives q/k/v/o theirs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields


@dataclasses.dataclass(frozen=True)
class DynamicMask:
    """The keys a query keeps past the window, and dt_proj's bias."""

    keep_window_size: int = 2048
    dt_bias: bool = False


def read_dynamic_mask(raw: Mapping[str, Any]) -> DynamicMask:
    """DogeConfig's keep_window_size (2048 by default) and attention_bias."""
    return DynamicMask(
        keep_window_size=fields.integer(raw.get("keep_window_size"), "keep_window_size", 2048),
        dt_bias=fields.flag(raw.get("attention_bias"), "attention_bias", False),
    )
