"""GGUF metadata → the config.json and generation_config.json a HuggingFace checkpoint has.

One row per llama.cpp architecture: its model_type and the config keys that differ; the keys
llama.cpp writes under `<arch>.` map to the same config.json keys for all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.errors import ConfigError, UnsupportedModelError

__all__ = [
    "ARCHITECTURES",
    "ROPE_TENSORS",
    "Architecture",
    "config_json",
    "generation_config",
]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """How one llama.cpp architecture maps to a transformers family."""

    model_type: str
    hf_class: str
    permuted_qk: bool = False
    """llama.cpp's converter permutes the rows of Q and K for its rotary layout (llama)."""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """config.json keys the GGUF does not store: the values llama.cpp assumes."""
    names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Per-layer llama.cpp tensor names whose HuggingFace name differs from llama's."""
    norm_offset: float = 0.0
    """The converter stored norm weights plus this (gemma: 1 + w); reads subtract it."""
    scale_is_head_dim: bool = False
    """query_pre_attn_scalar is head_dim (llama.cpp's gemma3; not stored)."""
    scale_per_head_layers: tuple[int, ...] = ()
    """Block counts at which query_pre_attn_scalar is hidden_size / heads instead: llama.cpp
    (llama-model.cpp) takes gemma3 with 62 layers for 27B, whose config.json has 5376 / 32 = 168
    where head_dim is 128."""


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", "LlamaForCausalLM", permuted_qk=True),
    "qwen2": Architecture("qwen2", "Qwen2ForCausalLM"),
    "qwen3": Architecture("qwen3", "Qwen3ForCausalLM"),
    # llama.cpp (llama-model.cpp) fixes gemma3's local rope base at 10000 and one global
    # layer in 6 (the family's default layer_types), no logit softcapping
    "gemma3": Architecture(
        "gemma3_text",
        "Gemma3ForCausalLM",
        extra={
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "rope_local_base_freq": 10000.0,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
        },
        names={
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
        norm_offset=1.0,
        scale_is_head_dim=True,
        scale_per_head_layers=(62,),
    ),
    # fused [q; k; v] and [gate; up] rows, read as HuggingFace phi3's qkv_proj / gate_up_proj
    "phi3": Architecture(
        "phi3",
        "Phi3ForCausalLM",
        names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    ),
}

#: config.json key → GGUF key under `<arch>.`.
_KEYS = {
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "max_position_embeddings": "context_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "head_dim": "attention.key_length",
    "sliding_window": "attention.sliding_window",
}


#: Tensors that are not weights: the rope's factors (llama.cpp's rope_freqs for Llama 3,
#: rope_factors_long / rope_factors_short for Phi-3's longrope) → the rope_scaling key of each.
ROPE_TENSORS = {
    "rope_freqs.weight": "frequency_factors",
    "rope_factors_long.weight": "long_factor",
    "rope_factors_short.weight": "short_factor",
}


def architecture(meta: Mapping[str, Any], where: str) -> tuple[str, Architecture]:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{where}: general.architecture is {arch!r}; accepted: {', '.join(ARCHITECTURES)}"
        )
    return arch, ARCHITECTURES[arch]


def config_json(
    meta: Mapping[str, Any],
    tied: bool,
    vocab: int,
    where: str,
    rope_tensors: Mapping[str, tuple[float, ...]] | None = None,
) -> dict[str, Any]:
    """config.json for the GGUF's architecture (`tied`: the GGUF has no output.weight;
    `rope_tensors`: its `ROPE_TENSORS` by name)."""
    arch, row = architecture(meta, where)
    config: dict[str, Any] = {
        "model_type": row.model_type,
        "architectures": [row.hf_class],
        "hidden_act": "silu",
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        **row.extra,
    }
    for key, gguf_key in _KEYS.items():
        value = meta.get(f"{arch}.{gguf_key}")
        if value is not None:
            config[key] = value
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if key not in config:
            raise UnsupportedModelError(f"{where}: metadata lacks {arch}.{_KEYS[key]}")
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    if row.scale_is_head_dim:
        config["query_pre_attn_scalar"] = config["head_dim"]
    if config["num_hidden_layers"] in row.scale_per_head_layers:
        config["query_pre_attn_scalar"] = config["hidden_size"] // config["num_attention_heads"]
    rotated = _rotated_channels(meta, arch, config["head_dim"], where)
    if rotated != config["head_dim"]:  # Phi-4-mini (architecture phi3) rotates 3/4 of a head
        config["partial_rotary_factor"] = rotated / config["head_dim"]
    config.update(_rope_scaling(meta, arch, rope_tensors or {}, rotated // 2, where))
    config.update(generation_config(meta))
    return config


def _rotated_channels(meta: Mapping[str, Any], arch: str, head_dim: int, where: str) -> int:
    """The channels of a head the rope rotates: {arch}.rope.dimension_count, else all."""
    key = f"{arch}.rope.dimension_count"
    rotated = meta.get(key, head_dim)
    if not isinstance(rotated, int) or isinstance(rotated, bool) or not 2 <= rotated <= head_dim:
        raise ConfigError(
            f"{where}: {key} is {rotated!r}; accepted: an even number of channels, 2 to the "
            f"head's {head_dim}"
        )
    if rotated % 2:
        raise ConfigError(f"{where}: {key} is {rotated}; accepted: an even number of channels")
    return rotated


def _rope_scaling(
    meta: Mapping[str, Any],
    arch: str,
    tensors: Mapping[str, tuple[float, ...]],
    pairs: int,
    where: str,
) -> dict[str, Any]:
    """config.json's rope_scaling (and original_max_position_embeddings) from llama.cpp's:
    rope.scaling.type linear + factor (gemma3 4B-27B: the hub config's rope_scaling, which
    applies to the global layers only), rope_factors_long / short + original_context_length
    (Phi-3's longrope; attn_factor is the cos/sin scale), rope_freqs (frequency factors)."""
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none", "linear"):
        raise UnsupportedModelError(
            f"{where}: {arch}.rope.scaling.type is {scaling!r}; accepted: none, linear"
        )
    for name, factors in tensors.items():
        if len(factors) != pairs or min(factors) <= 0:
            raise ConfigError(
                f"{where}: tensor {name} has {len(factors)} entries, smallest "
                f"{min(factors, default=0)}; accepted: one positive factor per rotated channel "
                f"pair ({pairs})"
            )
    rope: dict[str, Any] = {ROPE_TENSORS[name]: list(factors) for name, factors in tensors.items()}
    found: dict[str, Any] = {}
    if scaling == "linear":
        rope.update(
            rope_type="linear", factor=_positive(meta, f"{arch}.rope.scaling.factor", where)
        )
    if "long_factor" in rope or "short_factor" in rope:
        if scaling == "linear" or not {"long_factor", "short_factor"} <= rope.keys():
            raise ConfigError(
                f"{where}: rope tensors {', '.join(sorted(tensors))} with rope.scaling.type "
                f"{scaling!r}; accepted: rope_factors_long and rope_factors_short together, "
                "without a scaling type"
            )
        key = f"{arch}.rope.scaling.original_context_length"
        found["original_max_position_embeddings"] = int(_positive(meta, key, where))
        rope["rope_type"] = "longrope"
        if meta.get(f"{arch}.rope.scaling.attn_factor") is not None:
            key = f"{arch}.rope.scaling.attn_factor"
            rope["attention_factor"] = _positive(meta, key, where)
    if rope:
        found["rope_scaling"] = {"rope_type": "default", **rope}
    return found


def _positive(meta: Mapping[str, Any], key: str, where: str) -> float:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{where}: {key} is {value!r}; accepted: a positive number")
    return float(value)


def generation_config(meta: Mapping[str, Any]) -> dict[str, Any]:
    """bos / eos / pad token ids as the GGUF's tokenizer metadata gives them."""
    keys = {"bos_token_id": "bos", "eos_token_id": "eos", "pad_token_id": "padding"}
    found = {key: meta.get(f"tokenizer.ggml.{name}_token_id") for key, name in keys.items()}
    return {key: int(value) for key, value in found.items() if value is not None}
