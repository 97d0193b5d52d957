"""Mamba2 (`mamba2`: Codestral Mamba, state-spaces/mamba2-*): Mamba's layout (mamba1_rows.py)
with a Mamba2 mixer (components/mamba2.py) in every layer, as a row of the family table.

Every layer is one block, h = x + mixer(norm(x)), with no attention, no MLP and no KV cache:
a conv state and a scan state per layer, which onnxruntime-genai 0.18 runs as it runs Mamba's.
Tensors stay under the hub's `backbone.` (`embeddings`, each layer's `norm` and `mixer`,
`norm_f`). transformers' Mamba2RMSNormGated always gates before it normalizes, per group of
channels (`n_groups`), whatever `norm_before_gate` config.json carries; it has no switch for
`rms_norm`, so a config that turns the norm off is refused. `residual_in_fp32` (the default)
keeps the residual stream float32 in a float16 or bfloat16 bundle, as for Mamba;
`rescale_prenorm_residual` and `chunk_size` only shape training and the prefill's chunking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.mamba2 import MAMBA2_KEYS, Mamba2Config, read_mamba2
from mobius_genai.errors import ConfigError
from mobius_genai.models.families.mamba1_rows import MAMBA, stand_in_heads


def _mamba2_layers(raw: Mapping[str, Any]) -> tuple[str, ...]:
    return ("mamba2",) * fields.require(raw, "num_hidden_layers")


def mamba2_sizes(raw: Mapping[str, Any]) -> Mamba2Config:
    """Mamba2Config's mixer sizes; its gated norm as transformers builds it (gate, then norm)."""
    if not fields.flag(raw.get("rms_norm"), "rms_norm", True):
        raise ConfigError(
            "config.json: rms_norm is false; accepted: true (transformers' Mamba2 mixer always "
            "normalizes its gated output)"
        )
    return read_mamba2(raw, MAMBA2_KEYS)


MAMBA2 = dataclasses.replace(
    MAMBA,
    model_type="mamba2",
    config_defaults={**MAMBA.config_defaults, "tie_word_embeddings": False},  # Mamba2Config's
    config_overrides={
        **{key: value for key, value in MAMBA.config_overrides.items() if key != "mamba1"},
        "layer_types": _mamba2_layers,
        # config.json's head_dim is the mixer's; the stand-in attention heads are Mamba's
        "head_dim": lambda raw: fields.require(raw, "hidden_size") // stand_in_heads(raw),
        "mamba2": mamba2_sizes,
    },
)
