"""Family adapters: what distinguishes one checkpoint family from the generic decoder, as data.

An adapter holds the facts config.json leaves implicit (config overrides), the name
onnxruntime-genai knows the family by, and how checkpoint weight names map to graph parameter
names. Adding a family is adding a row to `_FAMILIES`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mobius_genai.config import ArchitectureConfig
from mobius_genai.errors import UnsupportedModelError


def _identity(name: str, array: np.ndarray, config: ArchitectureConfig) -> np.ndarray:
    return array


@dataclasses.dataclass(frozen=True)
class FamilyAdapter:
    """Differences of one model_type from the generic llama-style decoder."""

    model_type: str
    genai_type: str
    config_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # (pattern, replacement) pairs applied in order to graph parameter names.
    weight_renames: tuple[tuple[str, str], ...] = ()
    # Hook for value changes a family needs (e.g. norm offsets); receives the graph name.
    preprocess_weight: Callable[[str, np.ndarray, ArchitectureConfig], np.ndarray] = _identity

    def parse_config(self, raw: Mapping[str, Any]) -> ArchitectureConfig:
        """The ArchitectureConfig of a config.json of this family."""
        overrides = {
            key: value(raw) if callable(value) else value
            for key, value in self.config_overrides.items()
        }
        return ArchitectureConfig.from_dict(raw, **overrides)

    def checkpoint_name(self, graph_name: str) -> str:
        """The checkpoint tensor a graph parameter is read from."""
        for pattern, replacement in self.weight_renames:
            graph_name = re.sub(pattern, replacement, graph_name)
        return graph_name


_FAMILIES = (
    FamilyAdapter(model_type="llama", genai_type="llama"),
    FamilyAdapter(model_type="mistral", genai_type="mistral"),
    FamilyAdapter(
        model_type="qwen2",
        genai_type="qwen2",
        config_overrides={"qkv_bias": True, "o_bias": False},
    ),
    FamilyAdapter(model_type="qwen3", genai_type="qwen3", config_overrides={"qk_norm": True}),
)

FAMILIES: dict[str, FamilyAdapter] = {family.model_type: family for family in _FAMILIES}


def get_family(model_type: str) -> FamilyAdapter:
    """The adapter for `model_type`, or an error listing the supported ones."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}"
        ) from None
