"""The checks every ArchitectureConfig goes through when it is made, one concern at a time:
its sizes, block kinds (and the kinds accepted), attention switches and multipliers here, each
other concern's (rope, layers, MoE, latent attention, ...) in that concern's module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mobius_genai.config import fields
from mobius_genai.config.attention_gate import validate_attention_gate
from mobius_genai.config.embedding_layout import validate_embedding_layout
from mobius_genai.config.head_layout import validate_head_layout
from mobius_genai.config.latent_attention import validate_latent_attention
from mobius_genai.config.layers import validate_layers
from mobius_genai.config.limits import check_size
from mobius_genai.config.local_global import validate_local_global
from mobius_genai.config.moe import validate_moe
from mobius_genai.config.rope import validate_rope
from mobius_genai.errors import ConfigError

if TYPE_CHECKING:
    from mobius_genai.config.architecture import ArchitectureConfig

HIDDEN_ACTS = (
    "silu",
    "gelu",
    "gelu_new",
    "gelu_pytorch_tanh",
    "gelu_fast",
    "quick_gelu",
    "relu",
    "relu2",
)
#: Activations with learned parameters, which a decoder's ungated MLP carries (components/mlp.py).
LEARNED_ACTS = ("xielu",)
NORM_TYPES = ("rms", "layer", "layer_no_bias", "layer_no_affine", "rms_no_affine")
NORM_PLACEMENTS = ("pre", "sandwich", "post", "post_residual")
POSITION_EMBEDDINGS = ("rope", "learned", "sinusoidal", "alibi")


def validate(config: ArchitectureConfig) -> None:
    """Refuse a config the decoder cannot build, one concern at a time."""
    _validate_sizes(config)
    _validate_block_kinds(config)
    validate_layers(config)
    validate_local_global(config.local_global, config.layer_types)
    validate_attention_gate(config.attention_gate)
    validate_head_layout(
        config.head_layout, config.head_dim, config.num_key_value_heads, config.num_hidden_layers
    )
    _validate_attention_switches(config)
    _validate_multipliers(config)
    validate_embedding_layout(config.embedding_layout, config.position_embedding)
    validate_moe(config.moe, config.hidden_act)
    validate_latent_attention(config.latent_attention, config.head_dim, config.num_key_value_heads)
    latent = config.latent_attention  # its rope turns each head's rope slice
    rope_head = config.head_dim if latent is None else latent.qk_rope_head_dim
    layer_ropes = (config.rope_of_layer(i) for i in range(config.num_hidden_layers))
    for rope in dict.fromkeys((config.rope, config.rope_local, *layer_ropes)):
        if rope is not None:
            validate_rope(rope, rope_head)


def _validate_sizes(config: ArchitectureConfig) -> None:
    """Sizes are positive integers and the query heads share the key/value heads evenly."""
    sizes = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    )
    for name in sizes:
        value = getattr(config, name)
        if not fields.is_int(value) or value <= 0:
            raise ConfigError(
                f"config.json: field {name!r} must be a positive integer, found {value!r}"
            )
        check_size(name, value)
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConfigError(
            f"config.json: num_attention_heads {config.num_attention_heads} is not divisible by "
            f"num_key_value_heads {config.num_key_value_heads}; accepted: a divisor of the "
            "attention head count"
        )


def _validate_block_kinds(config: ArchitectureConfig) -> None:
    """Activation, norm type and placement, position embedding and residual layout are known
    kinds that fit together."""
    if config.hidden_act not in HIDDEN_ACTS + LEARNED_ACTS:
        raise ConfigError(
            f"config.json: hidden_act {config.hidden_act!r} is not supported; accepted: "
            f"{list(HIDDEN_ACTS + LEARNED_ACTS)}"
        )
    if config.hidden_act in LEARNED_ACTS and config.gated_mlp:
        raise ConfigError(
            f"config.json: hidden_act {config.hidden_act!r} is supported in an ungated MLP "
            "(up, activation, down) only, found a gated one"
        )
    for name, accepted in (
        ("norm_type", NORM_TYPES),
        ("norm_placement", NORM_PLACEMENTS),
        ("position_embedding", POSITION_EMBEDDINGS),
    ):
        if getattr(config, name) not in accepted:
            raise ConfigError(
                f"config.json: {name} {getattr(config, name)!r} is not supported; accepted: "
                f"{list(accepted)}"
            )
    if (config.position_embedding == "alibi") != (config.alibi is not None):
        raise ConfigError(
            f"config.json: position_embedding {config.position_embedding!r} with alibi "
            f"{config.alibi!r}; accepted: ALiBi settings exactly with position_embedding 'alibi'"
        )
    if config.recurrent_norm_placement not in (None, *NORM_PLACEMENTS):
        raise ConfigError(
            f"config.json: recurrent_norm_placement {config.recurrent_norm_placement!r} is not "
            f"supported; accepted: None or one of {list(NORM_PLACEMENTS)}"
        )
    if config.parallel_residual and config.norm_placement != "pre":
        raise ConfigError(
            f"config.json: a parallel residual needs norm_placement 'pre', found "
            f"{config.norm_placement!r}"
        )
    if config.residual_after_norm and (config.norm_placement != "pre" or config.parallel_residual):
        raise ConfigError(
            "config.json: a residual taken after the norm (residual_after_norm) needs "
            f"norm_placement 'pre' without a parallel residual, found {config.norm_placement!r}"
        )
    if config.parallel_mlp_norm and not config.parallel_residual:
        raise ConfigError(
            "config.json: a separate MLP norm of the parallel residual (parallel_mlp_norm) needs "
            "parallel_residual, found parallel_residual False"
        )


def _validate_attention_switches(config: ArchitectureConfig) -> None:
    """q/k norm switches only refine a q/k norm the config has; clip_qkv is positive."""
    if config.qk_norm_head_weights and not (config.qk_norm and config.qk_norm_per_head):
        raise ConfigError(
            "config.json: per-head q/k norm weights need qk_norm normalizing each head, found "
            f"qk_norm {config.qk_norm} and qk_norm_per_head {config.qk_norm_per_head}"
        )
    if config.qk_norm_stacked_weights and not config.qk_norm_head_weights:
        raise ConfigError(
            "config.json: stacked per-head q/k norm weights (qk_norm_stacked_weights) need "
            "qk_norm_head_weights, found qk_norm_head_weights False"
        )
    if config.qk_norm_after_rope and not config.qk_norm:
        raise ConfigError(
            "config.json: normalizing q/k after the rotary embedding (qk_norm_after_rope) needs "
            "qk_norm, found qk_norm False"
        )
    if config.clip_qkv is not None and (
        not fields.is_number(config.clip_qkv) or config.clip_qkv <= 0
    ):
        raise ConfigError(
            f"config.json: clip_qkv must be a positive number or null, found {config.clip_qkv!r}"
        )


def _validate_multipliers(config: ArchitectureConfig) -> None:
    """Embedding, residual and logit scales are positive numbers."""
    for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
        value = getattr(config, name)
        if not fields.is_number(value) or value <= 0:
            raise ConfigError(f"config.json: {name} must be a positive number, found {value!r}")
