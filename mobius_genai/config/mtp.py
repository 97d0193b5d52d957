"""A checkpoint's multi-token-prediction head, as config.json describes it (the hub's keys of
Qwen3.5 / Qwen3.6 `text_config` and Qwen3-Next's top level)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import ArchitectureConfig, fields
from mobius_genai.errors import UnsupportedModelError

#: onnxruntime-genai 0.18's MtpGenerator chains one head module (its genai_config `mtp`
#: section has one graph); vLLM steps through several layers, one per draft.
OG_HEAD_LAYERS = 1


@dataclasses.dataclass(frozen=True)
class MtpKeys:
    """The config.json names of a family's MTP head (a family row's data)."""

    layers: str = "mtp_num_hidden_layers"
    dedicated_embeddings: str = "mtp_use_dedicated_embeddings"


def mtp_layers(text_keys: Mapping[str, Any], keys: MtpKeys) -> int:
    """The head's decoder layers config.json declares (0: no head); a count og cannot run and
    a dedicated embedding table are refused in one line."""
    layers = fields.integer(text_keys.get(keys.layers), keys.layers, 0, positive=False)
    if layers not in (0, OG_HEAD_LAYERS):
        raise UnsupportedModelError(
            f"config.json: {keys.layers} is {layers}; accepted: 0 or {OG_HEAD_LAYERS} "
            "(onnxruntime-genai 0.18's MtpGenerator runs a head of one decoder layer)"
        )
    if layers and fields.flag(
        text_keys.get(keys.dedicated_embeddings), keys.dedicated_embeddings, False
    ):
        raise UnsupportedModelError(
            f"config.json: {keys.dedicated_embeddings} is true; accepted: false (the MTP head "
            "reads the main model's embedding table)"
        )
    return layers


def head_config(config: ArchitectureConfig) -> ArchitectureConfig:
    """The decoder's config cut to the head's one full-attention layer (with the model's MoE
    block when it has experts, as the hub's heads do)."""
    moe = config.moe
    return dataclasses.replace(
        config,
        num_hidden_layers=OG_HEAD_LAYERS,
        layer_types=("full_attention",),
        no_rope_layers=(),
        moe=None if moe is None else dataclasses.replace(moe, sparse_layers=(0,)),
    )
