"""hyperclovax (NAVER's HyperCLOVA X SEED): granite's layer and µP multipliers with
Peri-Layer Normalization, an RMSNorm on each block's output before the residual multiplier and
the add (the `sandwich` placement: post_norm1 after attention, post_norm2 after the MLP), and
logits multiplied by `logits_scaling` where granite divides by it.

`attention_multiplier` null or absent is 1/sqrt(head_dim), HyperCLOVAXConfig's own default.
Without `use_post_norm` the layer is granite's pre-norm one, whose MLP-input norm keeps the name
the sandwich layout gives another norm: refused here rather than misread. Defaults are
HyperCLOVAXConfig's (GraniteConfig's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter
from mobius_genai.models.families.family_keys import READS_MLP_BIAS
from mobius_genai.models.families.heads import split_hidden
from mobius_genai.models.families.readers import positive_number
from mobius_genai.models.families.scales import GRANITE_MULTIPLIERS


def _attention_scale(raw: Mapping[str, Any]) -> float:
    """attention_multiplier; 1/sqrt(head_dim) where null or absent, as HyperCLOVAXConfig
    fills it in."""
    head_dim = raw.get("head_dim") or split_hidden(raw)
    return fields.number(
        raw.get("attention_multiplier"), "attention_multiplier", head_dim**-0.5, positive=True
    )


def _peri_norms(raw: Mapping[str, Any]) -> str:
    if not fields.flag(raw.get("use_post_norm"), "use_post_norm", True):
        raise UnsupportedModelError(
            "config.json: use_post_norm is false; hyperclovax models are supported only with "
            "their post norms (use_post_norm true, HyperCLOVAXConfig's default)"
        )
    return "sandwich"


HYPERCLOVAX = FamilyAdapter(
    model_type="hyperclovax",
    family_keys=READS_MLP_BIAS,
    config_overrides={
        **GRANITE_MULTIPLIERS,
        # our logits are divided by logits_scaling (granite's); HyperCLOVAX multiplies
        "logits_scaling": lambda raw: 1.0 / positive_number("logits_scaling")(raw),
        "attention_scale": _attention_scale,
        "norm_placement": _peri_norms,
    },
    # the sandwich's norms in order: input_layernorm, post_norm1, post_attention_layernorm (the
    # MLP's input), post_norm2; renamed in this order so no name is renamed twice
    weight_renames=(
        (r"\.post_attention_layernorm\.", ".post_norm1."),
        (r"\.pre_feedforward_layernorm\.", ".post_attention_layernorm."),
        (r"\.post_feedforward_layernorm\.", ".post_norm2."),
    ),
)
