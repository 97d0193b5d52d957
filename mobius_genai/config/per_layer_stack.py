"""Gemma 4's decoder (`gemma4_text`): layers whose attention geometry follows their type, a
per-layer input table, layers attending over an earlier layer's cache, and an MoE block beside
the MLP.

- Full-attention layers have their own head size (`global_head_dim`) and, when keys are values
  (`attention_k_eq_v`: no v_proj, V = K before their norms), their own key/value head count
  (`num_global_key_value_heads`). transformers 5 writes the same as `per_layer_config`
  ({layer: {head_dim, num_key_value_heads}}); the hub's configs carry the two keys.
- Per-layer inputs: a second embedding table [per_layer_vocab, table_layers * per_layer_size]
  plus a projection of the token embedding (as Gemma 3n's, config/altup.py), one slice per
  layer, gated into the residual after the MLP.
- `kv_sources[i]`: the layer whose keys and values layer i attends over (the last
  `num_kv_shared_layers` read the last unshared layer of their attention type).
- `intermediate_sizes[i]`: layer i's MLP width (`use_double_wide_mlp`: twice as wide in the
  layers sharing a cache).
- `experts`: with `enable_moe_block`, every layer also runs `num_experts` GeGLU experts
  (`top_k_experts` of them per token, `moe_intermediate_size` wide) on its residual, their
  output added to the MLP's (components/per_layer_stack.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.altup import kv_sources
from mobius_genai.config.layers import check_one_type_per_layer, parse_layer_types
from mobius_genai.config.moe import MoeConfig
from mobius_genai.errors import ConfigError, UnsupportedModelError

FULL = "full_attention"


@dataclasses.dataclass(frozen=True)
class PerLayerStack:
    """Gemma 4's per-layer sizes and switches (see the module docstring)."""

    full_head_dim: int
    full_kv_heads: int
    keys_are_values: bool
    per_layer_size: int
    per_layer_vocab: int
    # the checkpoint's layer count: the per-layer table holds a slice for each, in a twin too
    table_layers: int
    intermediate_sizes: tuple[int, ...]
    kv_sources: tuple[int, ...]
    experts: MoeConfig | None = None
    # (pad id, ids): a multimodal model's soft-token ids (images, video, audio), whose
    # per-layer rows are the pad token's (Gemma4Model.forward); none for a text model
    soft_tokens: tuple[int, tuple[int, ...]] | None = None

    def first_layers(self, count: int) -> PerLayerStack:
        """The section of the first `count` layers (a layer's source is never after it)."""
        return dataclasses.replace(
            self,
            intermediate_sizes=self.intermediate_sizes[:count],
            kv_sources=self.kv_sources[:count],
        )


def _full_geometry(raw: Mapping[str, Any], k_eq_v: bool) -> tuple[int, int]:
    """(head size, key/value heads) of the full layers, from the hub's keys or transformers'
    per_layer_config."""
    head_dim = fields.require(raw, "head_dim")
    kv_heads = fields.integer(raw.get("num_key_value_heads"), "num_key_value_heads")
    per_layer = fields.mapping(raw.get("per_layer_config"), "per_layer_config")
    if per_layer:
        shapes = {
            (
                fields.integer(entry.get("head_dim"), "per_layer_config.head_dim", head_dim),
                fields.integer(
                    entry.get("num_key_value_heads"),
                    "per_layer_config.num_key_value_heads",
                    kv_heads,
                ),
            )
            for entry in per_layer.values()
        }
        if len(shapes) != 1:
            raise ConfigError(
                f"config.json: per_layer_config gives the full layers {len(shapes)} different "
                "(head_dim, num_key_value_heads); accepted: one geometry for every full layer"
            )
        return shapes.pop()
    full_head = fields.integer(raw.get("global_head_dim"), "global_head_dim", 512)
    full_kv = fields.integer(raw.get("num_global_key_value_heads"), "num_global_key_value_heads")
    return full_head, (full_kv if k_eq_v and full_kv is not None else kv_heads)


def _experts(raw: Mapping[str, Any], layers: int) -> MoeConfig | None:
    """Softmax routing, the top k renormalized (each pick then scaled by its expert's
    per_expert_scale, components/stack_experts.py), in every layer."""
    if not fields.flag(raw.get("enable_moe_block"), "enable_moe_block", False):
        return None
    sizes = {}
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        sizes[key] = fields.integer(raw.get(key), key)
        if sizes[key] is None:
            raise ConfigError(
                f"config.json: enable_moe_block is true but {key} is missing; accepted: a "
                "positive integer"
            )
    if sizes["top_k_experts"] > sizes["num_experts"]:
        raise ConfigError(
            f"config.json: top_k_experts {sizes['top_k_experts']} exceeds num_experts "
            f"{sizes['num_experts']}; accepted: 1 to num_experts"
        )
    return MoeConfig(
        num_experts=sizes["num_experts"],
        top_k=sizes["top_k_experts"],
        intermediate_size=sizes["moe_intermediate_size"],
        normalize_top_k=True,
        sparse_layers=tuple(range(layers)),
    )


def per_layer_stack(raw: Mapping[str, Any]) -> PerLayerStack:
    """The PerLayerStack of a gemma4_text config.json (transformers' Gemma4TextConfig defaults
    for absent keys). `use_bidirectional_attention` "vision" makes image tokens attend both
    ways, which a text decoder never sees; "all" (no causal mask) is refused."""
    bidirectional = raw.get("use_bidirectional_attention")
    if bidirectional not in (None, "vision"):
        raise UnsupportedModelError(
            f"config.json: use_bidirectional_attention is {bidirectional!r}; accepted: null, or "
            "'vision' (image tokens only: a text decoder attends causally)"
        )
    layers = fields.require(raw, "num_hidden_layers")
    k_eq_v = fields.flag(raw.get("attention_k_eq_v"), "attention_k_eq_v", False)
    full_head, full_kv = _full_geometry(raw, k_eq_v)
    types = parse_layer_types(raw, layers)
    check_one_type_per_layer(types, layers)
    shared = fields.integer(
        raw.get("num_kv_shared_layers"), "num_kv_shared_layers", 0, positive=False
    )
    sources = kv_sources(types, shared)
    wide = fields.flag(raw.get("use_double_wide_mlp"), "use_double_wide_mlp", False)
    width = fields.require(raw, "intermediate_size")
    return PerLayerStack(
        full_head_dim=full_head,
        full_kv_heads=full_kv,
        keys_are_values=k_eq_v,
        per_layer_size=fields.integer(
            raw.get("hidden_size_per_layer_input"),
            "hidden_size_per_layer_input",
            256,
            positive=False,
        ),
        per_layer_vocab=fields.integer(
            raw.get("vocab_size_per_layer_input"), "vocab_size_per_layer_input", 262_144
        ),
        table_layers=layers,
        intermediate_sizes=tuple(
            width * (2 if wide and sources[i] != i else 1) for i in range(layers)
        ),
        kv_sources=sources,
        experts=_experts(raw, layers),
    )
