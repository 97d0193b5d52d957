"""Model types transformers runs with another family's model classes under a config class of
their own: each row is a copy of that family's row with the config class's defaults and key
names (its attribute_map), which differ from the parent's.

apertus1p5_text (Apertus 1.5's text decoder) runs as apertus with a larger vocabulary, its
LM head possibly pruned (`output_vocab_size`: refused);
iquestcoder (IQuest-Coder) runs as llama; param2moe (Param2) and sarvam_moe (Sarvam-30B) as
GLM-4 MoE, rotating the whole head where glm4_moe rotates half of it; sarvam_mla (Sarvam-105B)
as DeepSeek-V3, every group routed at once, one q_proj, and its hub configs' `deepseek_yarn`
rope read as yarn (SarvamMLAConfig converts it so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import ConfigValue, FamilyAdapter, FusedWeight
from mobius_genai.models.families.readers import when_absent


@dataclasses.dataclass(frozen=True)
class Alias:
    """A model_type built by the row of `parent`, with its own config class's key names
    (`config_aliases`, added to the parent's) and defaults (replacing the parent's)."""

    model_type: str
    parent: str
    config_defaults: Mapping[str, ConfigValue]
    config_aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # fields this model type fixes or checks, added to the parent's
    config_overrides: Mapping[str, ConfigValue] = dataclasses.field(default_factory=dict)
    # the checkpoint's own names (transformers' conversion_mapping renames them on load),
    # applied after the parent's renames
    weight_renames: tuple[tuple[str, str], ...] = ()
    fused_weights: tuple[FusedWeight, ...] = ()
    # checkpoint tensors the build skips, in place of the parent's (whose MTP layers these
    # model types do not ship)
    unused_weights: tuple[str, ...] = ()

    def row(self, parent: FamilyAdapter) -> FamilyAdapter:
        """The parent's row under this model_type, with this config class's keys."""
        return dataclasses.replace(
            parent,
            model_type=self.model_type,
            config_aliases={**parent.config_aliases, **self.config_aliases},
            config_defaults={**parent.config_defaults, **self.config_defaults},
            config_overrides={**parent.config_overrides, **self.config_overrides},
            weight_renames=parent.weight_renames + self.weight_renames,
            fused_weights=self.fused_weights + parent.fused_weights,
            unused_weights=self.unused_weights,
        )


def _unpruned_vocab(raw: Mapping[str, Any]) -> int:
    """Apertus 1.5's vocab_size; an LM head pruned to the first `output_vocab_size` ids (the
    text tokens of the released checkpoints) is refused: the bundle's logits cover the
    vocabulary."""
    vocab = fields.require(raw, "vocab_size")
    pruned = raw.get("output_vocab_size")
    if pruned not in (None, vocab):
        raise UnsupportedModelError(
            f"config.json: output_vocab_size is {pruned!r}; apertus1p5_text models are "
            f"supported with the whole LM head (null or vocab_size, {vocab})"
        )
    return vocab


def _sarvam_rope(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """SarvamMLAConfig's reading of a hub config's rope_scaling of type `deepseek_yarn`:
    yarn with the same parameters. Any other rope is read as config.json gives it."""
    scaling = raw.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        return None
    if "deepseek_yarn" not in (scaling.get("type"), scaling.get("rope_type")):
        return None
    return {key: value for key, value in scaling.items() if key != "type"} | {"rope_type": "yarn"}


#: GLM-4 MoE's config classes' names of the expert and bias keys (Param2's and Sarvam's hub
#: configs use them).
_GLM4_MOE_NAMES = {
    "num_experts": "n_routed_experts",
    "num_shared_experts": "n_shared_experts",
    "use_qkv_bias": "attention_bias",
}
#: Their checkpoints' original names (their remote code's): q, k and v rows fused in
#: query_key_value, the output projection `dense`, the q/k norms query_ and key_layernorm, the
#: correction bias `expert_bias`, the embeddings `word_embeddings`.
_ORIGINAL_QKV = FusedWeight(
    r"\.self_attn\.(?P<part>q|k|v)_proj\.(?P<kind>weight|bias)$",
    r".self_attn.qkv_proj.\g<kind>",
    ("q", "k", "v"),
)
_ORIGINAL_NAMES = (
    (r"\.self_attn\.qkv_proj\.", ".attention.query_key_value."),
    (r"\.self_attn\.o_proj\.", ".attention.dense."),
    (r"\.self_attn\.q_norm\.", ".attention.query_layernorm."),
    (r"\.self_attn\.k_norm\.", ".attention.key_layernorm."),
    (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.gate.expert_bias"),
    (r"^model\.embed_tokens\.", "model.word_embeddings."),
)

ALIASES = (
    Alias(
        "apertus1p5_text",
        parent="apertus",
        config_defaults={"vocab_size": 266_752, "max_position_embeddings": 65_536},
        config_overrides={"vocab_size": _unpruned_vocab},
        # the multimodal checkpoints' image and audio tokenizers
        unused_weights=(r"^model\.vision_tokenizer\.", r"^model\.audio_tokenizer\."),
    ),
    Alias(
        "iquestcoder",
        parent="llama",
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "num_key_value_heads": when_absent("num_key_value_heads", 8),
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072,
        },
    ),
    Alias(
        "param2moe",
        parent="glm4_moe",
        config_aliases=_GLM4_MOE_NAMES,
        weight_renames=_ORIGINAL_NAMES,
        fused_weights=(_ORIGINAL_QKV,),
        config_defaults={
            "head_dim": 64,
            "num_key_value_heads": 8,
            "partial_rotary_factor": 1.0,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "rope_theta": 500_000.0,  # Param2MoeConfig's default_theta
            "tie_word_embeddings": True,
            "use_qk_norm": True,
            "n_routed_experts": 64,
            "n_shared_experts": 2,
            "moe_intermediate_size": 2048,
            "num_experts_per_tok": 6,
            "routed_scaling_factor": 2.5,
        },
    ),
    Alias(
        "sarvam_moe",
        parent="glm4_moe",
        config_aliases=_GLM4_MOE_NAMES,
        weight_renames=_ORIGINAL_NAMES,
        fused_weights=(_ORIGINAL_QKV,),
        config_defaults={
            "head_dim": 64,
            "num_key_value_heads": 4,
            "partial_rotary_factor": 1.0,
            "rms_norm_eps": 1e-6,
            "rope_theta": 8_000_000.0,  # SarvamMoEConfig's default_theta
            "use_qk_norm": True,
            "n_routed_experts": 128,
            "n_shared_experts": 1,
            "moe_intermediate_size": 1024,
            "num_experts_per_tok": 6,
            "routed_scaling_factor": 2.5,
        },
    ),
    Alias(
        "sarvam_mla",
        parent="deepseek_v3",
        config_aliases={
            "num_experts": "n_routed_experts",
            "num_shared_experts": "n_shared_experts",
        },
        config_defaults={
            "q_lora_rank": None,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_parameters": _sarvam_rope,
            "n_routed_experts": 128,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
        },
    ),
)


def alias_rows(rows: Mapping[str, FamilyAdapter]) -> dict[str, FamilyAdapter]:
    """Each alias's row, derived from its parent's in `rows`."""
    return {alias.model_type: alias.row(rows[alias.parent]) for alias in ALIASES}
