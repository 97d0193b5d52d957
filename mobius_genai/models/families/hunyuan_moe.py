"""Hunyuan-A13B's MoE block (transformers' HunYuanMoEV1Moe) as a MoeConfig.

Its router `wg` is a float32 Linear whatever the model's dtype (HunYuanMoEV1Gate creates it
so, and casts the hidden state to float32 before it): softmax scores, the top-k renormalized.
That is GroupRouting's softmax over one group (components/group_router.py), which computes in
its weight's dtype, float32 where the row keeps `wg` so (float32.py). A shared MLP as wide as
the experts (both `intermediate_size`) runs beside them in every layer. `num_experts` and
`moe_topk` may be per-layer lists in config.json; transformers reads layer i's entry, and
one value for every layer is what the MoE node takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.moe import MoeConfig, MoeKeys, read_moe
from mobius_genai.config.moe_routing import GroupRouting
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.float32 import KeptFloat32

#: HunYuanMoEV1Gate's `wg`, created float32 (a buffer-like declaration, not a keep list).
HUNYUAN_ROUTER = KeptFloat32(declared=("gate.wg.weight",))
_PER_LAYER = ("num_experts", "num_experts_per_tok")


def _one_value(raw: Mapping[str, Any], key: str) -> Any:
    """`key`'s value, a list of one value per layer read as that value."""
    value = raw.get(key)
    if not isinstance(value, list):
        return value
    if len(set(value)) != 1 or len(value) != fields.require(raw, "num_hidden_layers"):
        raise UnsupportedModelError(
            f"config.json: {key} is {value!r}; hunyuan_v1_moe models are supported with one "
            "value for every layer"
        )
    return value[0]


def hunyuan_moe(raw: Mapping[str, Any]) -> MoeConfig:
    """Every layer's experts (`num_experts`, `moe_topk` per token, of `intermediate_size`),
    routed as HunYuanMoEV1Gate does, beside a shared MLP of `intermediate_size`."""
    raw = {**raw, **{key: _one_value(raw, key) for key in _PER_LAYER}}
    moe = read_moe(raw, MoeKeys(num_experts="num_experts", normalize=True))
    return dataclasses.replace(
        moe,
        shared_expert_size=moe.intermediate_size,
        group_routing=GroupRouting(scoring="softmax"),
    )
