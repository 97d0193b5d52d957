"""Family adapters: what distinguishes one checkpoint family from the generic decoder, as data.

An adapter holds the facts config.json leaves implicit (key aliases, transformers' defaults,
config overrides), the name onnxruntime-genai knows the family by, and how checkpoint tensors
map to graph parameters (renames, fused tensors split into parameters, matrices stored
[in, out], value changes such as gemma's `1 + weight` norms). Adding a family is adding a row
to `_FAMILIES`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mobius_genai.config import (
    ArchitectureConfig,
    RopeConfig,
    _flag,
    _integer,
    _mapping,
    _model_type,
    _number,
    _parse_rope,
    _require,
)
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.weights import TensorSource, no_preprocess

# A config value, or a function of the (aliased) config.json dict that computes it.
ConfigValue = Any | Callable[[Mapping[str, Any]], Any]


_NORM_WEIGHTS = r"norm\.weight$"


def _offset_norm_weights(name: str, array: np.ndarray, config: ArchitectureConfig) -> np.ndarray:
    """Gemma's RMSNorm and nemotron's LayerNorm1P scale by 1 + weight: store 1 + weight as
    the norm op's scale."""
    if re.search(_NORM_WEIGHTS, name):
        return array.astype(np.float32) + 1.0
    return array


@dataclasses.dataclass(frozen=True)
class FusedWeight:
    """Graph parameters stored as consecutive slices of one checkpoint tensor.

    `pattern` matches graph parameter names; its group `part` names the slice (one of
    `parts`, listed in storage order). `fused` is the re.sub replacement that gives the fused
    tensor's name in graph terms; it then goes through the adapter's `weight_renames`.
    `axis` is the checkpoint axis the slices are concatenated along.
    """

    pattern: str
    fused: str
    parts: tuple[str, ...]
    axis: int = 0


@dataclasses.dataclass(frozen=True)
class FamilyAdapter:
    """Differences of one model_type from the generic llama-style decoder."""

    model_type: str
    genai_type: str
    # config.json key → the standard key it stands for (transformers' attribute_map).
    config_aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Values for config.json keys that are absent or null, as transformers' config class fills them.
    config_defaults: Mapping[str, ConfigValue] = dataclasses.field(default_factory=dict)
    # ArchitectureConfig fields the family fixes (e.g. qwen2 always has q/k/v biases).
    config_overrides: Mapping[str, ConfigValue] = dataclasses.field(default_factory=dict)
    # config.json switches this package does not implement; a true value is refused.
    refused_keys: tuple[str, ...] = ()
    # (pattern, replacement) pairs applied in order to graph parameter names.
    weight_renames: tuple[tuple[str, str], ...] = ()
    fused_weights: tuple[FusedWeight, ...] = ()
    # Regex over checkpoint names of matrices stored [in, out] (GPT-2's Conv1D).
    in_out_weights: str | None = None
    # A prefix that checkpoints saved from the base model lack ("transformer." for gpt2).
    optional_prefix: str | None = None
    # Regexes over checkpoint names of buffers that are not weights (transformers'
    # _keys_to_ignore_on_load_unexpected, e.g. GPT-2's causal mask `attn.bias`); any other
    # tensor the graph does not read is an error (weight_checks.IGNORED_TENSORS: every family).
    unused_weights: tuple[str, ...] = ()
    # Hook for value changes a family needs (e.g. norm offsets); receives the graph name.
    preprocess_weight: Callable[[str, np.ndarray, ArchitectureConfig], np.ndarray] = no_preprocess
    # Regex over graph parameter names the hook changes (None: all); the others are read as
    # stored, matrices a block at a time (weights.CheckpointTensor).
    preprocessed_weights: str | None = None

    def preprocessed(self, name: str) -> bool:
        """Whether `preprocess_weight` may change the graph parameter `name`."""
        return (
            self.preprocessed_weights is None
            or re.search(self.preprocessed_weights, name) is not None
        )

    def parse_config(self, raw: Mapping[str, Any]) -> ArchitectureConfig:
        """The ArchitectureConfig of a config.json of this family."""
        raw = dict(raw)
        for alias, key in self.config_aliases.items():
            if alias in raw and raw.get(key) is None:
                raw[key] = raw[alias]
        for key, value in self.config_defaults.items():
            if raw.get(key) is None:
                raw[key] = value(raw) if callable(value) else value
        for key in self.refused_keys:
            if raw.get(key):
                raise UnsupportedModelError(
                    f"config.json: {key} is {raw[key]!r}; {self.model_type} models are supported "
                    f"only without it"
                )
        overrides = {
            key: value(raw) if callable(value) else value
            for key, value in self.config_overrides.items()
        }
        return ArchitectureConfig.from_dict(raw, **overrides)

    def checkpoint_name(self, graph_name: str) -> str | TensorSource:
        """The checkpoint tensor a graph parameter is read from.

        A plain name for a renamed tensor; a TensorSource when the parameter is a slice of a
        fused tensor, is stored [in, out], or may lack `optional_prefix`.
        """
        parts: tuple[str, ...] = ()
        axis = 0
        name = graph_name
        for fused in self.fused_weights:
            match = re.search(fused.pattern, graph_name)
            if match and match.group("part") in fused.parts:
                start, end = match.span("part")
                parts = tuple(graph_name[:start] + p + graph_name[end:] for p in fused.parts)
                name, axis = match.expand(fused.fused), fused.axis
                name = graph_name[: match.start()] + name + graph_name[match.end() :]
                break
        name = self._rename(name)
        in_out = bool(self.in_out_weights and re.search(self.in_out_weights, name))
        names = (name,)
        if self.optional_prefix and name.startswith(self.optional_prefix):
            names += (name[len(self.optional_prefix) :],)
        if not (parts or in_out or len(names) > 1):
            return name
        return TensorSource(names=names, in_out=in_out, parts=parts, axis=axis)

    def _rename(self, name: str) -> str:
        for pattern, replacement in self.weight_renames:
            name = re.sub(pattern, replacement, name)
        return name


def _query_pre_attn_scale(raw: Mapping[str, Any]) -> float:
    key = "query_pre_attn_scalar"
    return _number(raw.get(key), key, 256.0, positive=True) ** -0.5


def _sqrt_hidden(raw: Mapping[str, Any]) -> float:
    return math.sqrt(_require(raw, "hidden_size"))


def _alternating_layer_types(pattern: int) -> Callable[[Mapping[str, Any]], list[str]]:
    """Every `pattern`-th layer global, the others sliding (gemma2: 2, gemma3: 6)."""

    def layer_types(raw: Mapping[str, Any]) -> list[str]:
        every = _integer(raw.get("sliding_window_pattern"), "sliding_window_pattern", pattern)
        return [
            "sliding_attention" if (i + 1) % every else "full_attention"
            for i in range(_require(raw, "num_hidden_layers"))
        ]

    return layer_types


def _smollm3_no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """smollm3 lists a use-rope flag per layer; absent, every `interval`-th layer has none."""
    num_layers = _require(raw, "num_hidden_layers")
    flags = raw.get("no_rope_layers")
    if flags is None:
        interval = _integer(raw.get("no_rope_layer_interval"), "no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    elif not isinstance(flags, list | tuple) or len(flags) != num_layers:
        raise ConfigError(
            f"config.json: field 'no_rope_layers' must be a list of one 0/1 flag per layer "
            f"({num_layers}), found {flags!r}"
        )
    return tuple(i for i, use_rope in enumerate(flags) if not use_rope)


def _positive_number(key: str) -> Callable[[Mapping[str, Any]], float]:
    """An override: the positive number `key` of config.json, 1.0 when absent."""
    return lambda raw: _number(raw.get(key), key, 1.0, positive=True)


def _switch(key: str, default: bool) -> Callable[[Mapping[str, Any]], bool]:
    """An override: the true/false field `key` of config.json, `default` when absent."""
    return lambda raw: _flag(raw.get(key), key, default)


def _optional_positive(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    """An override: the positive number `key` of config.json, None when absent or null."""
    return lambda raw: _number(raw.get(key), key, positive=True)


def _hidden_over_heads(raw: Mapping[str, Any]) -> int:
    """The head size of families whose attention always splits hidden_size evenly over the
    heads, whatever a head_dim key says (stablelm, gpt_neox)."""
    hidden, heads = _require(raw, "hidden_size"), _require(raw, "num_attention_heads")
    head_dim = raw.get("head_dim")
    if hidden % heads or head_dim not in (None, hidden // heads):
        raise ConfigError(
            f"config.json: {raw.get('model_type')} needs hidden_size {hidden} divisible by "
            f"num_attention_heads {heads} and head_dim absent or equal to the quotient, found "
            f"head_dim {head_dim!r}"
        )
    return hidden // heads


def _when_absent(key: str, value: Any) -> Callable[[Mapping[str, Any]], Any]:
    """A default for configs whose class fills an absent `key` with `value` but keeps an
    explicit null (which config.py then resolves: hidden_size / heads, one kv head per head)."""
    return lambda raw: None if key in raw else value


def _olmo3_rope_local(raw: Mapping[str, Any]) -> RopeConfig | None:
    """Olmo3's sliding layers rotate without the rope scaling of its full-attention layers:
    default rope with the theta of `rope_parameters.sliding_attention`, else 500000.

    Without per-layer-type rope parameters, transformers 5 rotates sliding layers with
    Olmo3Config's default theta 500000 whatever rope_theta says, transformers 4 with rope_theta;
    a rope_theta other than 500000 is ambiguous there and refused."""
    rope, local = _parse_rope(raw)
    if rope.type == "longrope":
        raise UnsupportedModelError(
            "config.json: rope_scaling (rope_parameters) of type 'longrope' is not supported for "
            "olmo3 models"
        )
    if local is None:
        theta = _number(raw.get("rope_theta"), "rope_theta", 500_000.0, positive=True)
        if theta != 500_000.0:
            raise UnsupportedModelError(
                f"config.json: rope_theta is {theta!r} and rope_parameters has no "
                "'sliding_attention' entry; olmo3's sliding layers then rotate with 500000 in "
                "transformers 5 but with rope_theta in transformers 4, so the model is refused: "
                "give rope_parameters per layer type"
            )
        local = RopeConfig(theta=theta)
    return None if local == rope else local


def _exaone4_layer_types(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Exaone4Config's layer types: none sliding without a window, else every
    `sliding_window_pattern`-th layer (4 by default) full attention."""
    num_layers = _require(raw, "num_hidden_layers")
    if raw.get("sliding_window") is None:
        return ("full_attention",) * num_layers
    if raw.get("layer_types") is not None:
        return tuple(raw["layer_types"])
    key = "sliding_window_pattern"
    if isinstance(raw.get(key), str):
        raise UnsupportedModelError(
            f"config.json: {key} is {raw[key]!r} and layer_types is absent; exaone4 models are "
            "supported with an integer pattern or with layer_types"
        )
    return tuple(_alternating_layer_types(4)(raw))


def _exaone4_no_rope_layers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """EXAONE 4's hybrid models rotate only in sliding layers (global NoPE); without a window
    every layer rotates."""
    if raw.get("sliding_window") is None:
        return ()
    return tuple(i for i, kind in enumerate(_exaone4_layer_types(raw)) if kind == "full_attention")


def _ntk_alpha_rope(raw: Mapping[str, Any]) -> RopeConfig:
    """Hunyuan's rope: "dynamic" with a fixed `alpha` is NTK-alpha rope, a default rope whose
    base is rope_theta * alpha ** (head_dim / (head_dim - 2)) (transformers' ntk_alpha)."""
    rope, _ = _parse_rope(raw)
    params = {**_mapping(raw.get("rope_parameters"), "rope_parameters")}
    params.update(_mapping(raw.get("rope_scaling"), "rope_scaling"))
    alpha = params.get("alpha")
    if rope.type != "dynamic" or not alpha:
        return rope
    alpha = _number(alpha, "rope_scaling.alpha", positive=True)
    heads = _require(raw, "num_attention_heads")
    dim = _integer(raw.get("head_dim"), "head_dim") or _require(raw, "hidden_size") // heads
    return RopeConfig(theta=rope.theta * alpha ** (dim / (dim - 2)))


def _internlm3_bias(raw: Mapping[str, Any]) -> bool:
    """InternLM3 runs as llama: one bias switch for q, k, v and o, and one for the MLP; the
    transformers config refuses them differing, and so does this package."""
    attention = _flag(raw.get("attention_bias"), "attention_bias", False)
    mlp = _flag(raw.get("mlp_bias"), "mlp_bias", False)
    if attention != mlp:
        raise UnsupportedModelError(
            f"config.json: qkv_bias (attention_bias) is {attention} and bias (mlp_bias) is {mlp}; "
            "internlm3 models are supported only with both equal, as transformers runs them"
        )
    return attention


_PACKED_QKV = r"\.qkv_proj\.(weight|bias)$"


def _qkv_blocks_from_head_rows(
    name: str, array: np.ndarray, config: ArchitectureConfig
) -> np.ndarray:
    """GPT-NeoX's query_key_value rows, [q_0, k_0, v_0, q_1, k_1, v_1, ...] with head_dim
    rows per head and part, regrouped into the [q | k | v] blocks of the packed projection."""
    if not re.search(_PACKED_QKV, name):
        return array
    heads, head_dim = config.num_attention_heads, config.head_dim
    by_head = array.reshape(heads, 3, head_dim, *array.shape[1:])
    return np.ascontiguousarray(by_head.swapaxes(0, 1)).reshape(array.shape)


def _exaone_kv_heads(raw: Mapping[str, Any]) -> int:
    """ExaoneConfig: 8 key/value heads when the key is absent, one per query head when null."""
    return _require(raw, "num_attention_heads") if "num_key_value_heads" in raw else 8


def _gptj_partial_rotary(raw: Mapping[str, Any]) -> float:
    """GPT-J rotates the first `rotary_dim` channels of each head (GPTJConfig: 64 when absent;
    null rotates the whole head)."""
    head_dim = _hidden_over_heads(raw)
    rotary_dim = _integer(raw.get("rotary_dim", 64), "rotary_dim", head_dim)
    if rotary_dim > head_dim or rotary_dim % 2:
        raise ConfigError(
            f"config.json: field 'rotary_dim' must be an even number of channels at most the "
            f"head size {head_dim}, found {rotary_dim!r}"
        )
    factor = rotary_dim / head_dim
    while int(head_dim * factor) < rotary_dim:  # r / h * h can land just below r
        factor = math.nextafter(factor, math.inf)
    return factor


def _inverse_logit_scale(raw: Mapping[str, Any]) -> float:
    """cohere multiplies the logits by `logit_scale`; the graph divides by its inverse."""
    return 1.0 / _number(raw.get("logit_scale"), "logit_scale", 0.0625, positive=True)


def _gpt2_scale(raw: Mapping[str, Any]) -> float | None:
    return None if _flag(raw.get("scale_attn_weights"), "scale_attn_weights", True) else 1.0


def _gemma_activation(raw: Mapping[str, Any]) -> str:
    """gemma2/3 MLPs use `hidden_activation` (hub configs may also carry a `hidden_act`)."""
    return raw.get("hidden_activation") or "gelu_pytorch_tanh"


_GEMMA_REFUSED = ("use_bidirectional_attention",)
# What gemma2 changes over gemma; gemma3_text builds on it.
_GEMMA2_OVERRIDES = {
    "embedding_multiplier": _sqrt_hidden,
    "hidden_act": _gemma_activation,
    "norm_placement": "sandwich",
    "attention_scale": _query_pre_attn_scale,
}
# GPT-2's tensor layout (gpt2, gptj, exaone): the renames besides attention and MLP names.
_GPT2_LAYOUT = (
    (r"\.input_layernorm\.", ".ln_1."),
    (r"^model\.layers\.", "transformer.h."),
    (r"^model\.embed_tokens\.", "transformer.wte."),
    (r"^model\.norm\.", "transformer.ln_f."),
)
# GPT-2's attention buffers, the causal mask and its fill value (gpt2, gptj: transformers'
# _keys_to_ignore_on_load_unexpected).
_GPT2_BUFFERS = (r"\.attn\.(bias|masked_bias)$",)
# GPT-2's config.json names (gpt2, gptj).
_GPT2_CONFIG_NAMES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "n_inner": "intermediate_size",
    "activation_function": "hidden_act",
}
_FAMILIES = (
    FamilyAdapter(model_type="llama", genai_type="llama"),
    FamilyAdapter(model_type="mistral", genai_type="mistral"),
    FamilyAdapter(
        model_type="qwen2",
        genai_type="qwen2",
        config_overrides={"qkv_bias": True, "o_bias": False},
    ),
    FamilyAdapter(model_type="qwen3", genai_type="qwen3", config_overrides={"qk_norm": True}),
    FamilyAdapter(
        model_type="gemma",
        genai_type="gemma",
        config_defaults={"tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh"},
        config_overrides={"embedding_multiplier": _sqrt_hidden},
        refused_keys=_GEMMA_REFUSED,
        preprocess_weight=_offset_norm_weights,
        preprocessed_weights=_NORM_WEIGHTS,
    ),
    FamilyAdapter(
        model_type="gemma2",
        genai_type="gemma2",
        config_defaults={"tie_word_embeddings": True, "layer_types": _alternating_layer_types(2)},
        config_overrides=_GEMMA2_OVERRIDES,
        refused_keys=_GEMMA_REFUSED,
        preprocess_weight=_offset_norm_weights,
        preprocessed_weights=_NORM_WEIGHTS,
    ),
    FamilyAdapter(
        model_type="gemma3_text",
        genai_type="gemma3_text",
        config_defaults={"tie_word_embeddings": True, "layer_types": _alternating_layer_types(6)},
        config_overrides={
            **_GEMMA2_OVERRIDES,
            "qk_norm": True,
            # Gemma3Attention keeps attn_logit_softcapping but never applies it.
            "attn_logit_softcapping": None,
        },
        refused_keys=_GEMMA_REFUSED,
        preprocess_weight=_offset_norm_weights,
        preprocessed_weights=_NORM_WEIGHTS,
    ),
    FamilyAdapter(
        model_type="phi3",
        genai_type="phi3",
        fused_weights=(
            FusedWeight(
                r"\.self_attn\.(?P<part>q|k|v)_proj\.weight$",
                ".self_attn.qkv_proj.weight",
                ("q", "k", "v"),
            ),
            FusedWeight(
                r"\.mlp\.(?P<part>gate|up)_proj\.weight$",
                ".mlp.gate_up_proj.weight",
                ("gate", "up"),
            ),
        ),
    ),
    FamilyAdapter(
        model_type="phi",
        genai_type="phi",
        config_overrides={
            "norm_type": "layer",
            "parallel_residual": True,
            "gated_mlp": False,
            "qkv_bias": True,
            "o_bias": True,
            "mlp_bias": True,
            "lm_head_bias": True,
            "qk_norm": _switch("qk_layernorm", False),
        },
        weight_renames=(
            (r"\.self_attn\.o_proj\.", ".self_attn.dense."),
            (r"\.self_attn\.(q|k)_norm\.", r".self_attn.\1_layernorm."),
            (r"^model\.norm\.", "model.final_layernorm."),
        ),
    ),
    FamilyAdapter(
        model_type="gpt2",
        genai_type="decoder",  # onnxruntime-genai's "gpt2" expects another I/O contract
        config_aliases=_GPT2_CONFIG_NAMES,
        config_defaults={
            "intermediate_size": lambda raw: 4 * _require(raw, "hidden_size"),
            "tie_word_embeddings": True,
            "hidden_act": "gelu_new",
            "layer_norm_epsilon": 1e-5,
        },
        config_overrides={
            "norm_type": "layer",
            "gated_mlp": False,
            "qkv_bias": True,
            "o_bias": True,
            "mlp_bias": True,
            "position_embedding": "learned",
            "attention_scale": _gpt2_scale,
        },
        refused_keys=("scale_attn_by_inverse_layer_idx", "add_cross_attention"),
        fused_weights=(
            FusedWeight(
                r"\.self_attn\.(?P<part>q|k|v)_proj\.(weight|bias)$",
                r".self_attn.c_attn.\2",
                ("q", "k", "v"),
                axis=-1,
            ),
        ),
        weight_renames=(
            (r"\.self_attn\.o_proj\.", ".attn.c_proj."),
            (r"\.self_attn\.", ".attn."),
            (r"\.mlp\.fc1\.", ".mlp.c_fc."),
            (r"\.mlp\.fc2\.", ".mlp.c_proj."),
            (r"\.post_attention_layernorm\.", ".ln_2."),
            (r"^model\.embed_positions\.", "transformer.wpe."),
            *_GPT2_LAYOUT,
        ),
        in_out_weights=r"\.(c_attn|c_proj|c_fc)\.weight$",
        optional_prefix="transformer.",
        unused_weights=_GPT2_BUFFERS,
    ),
    FamilyAdapter(
        model_type="granite",
        genai_type="granite",
        config_overrides={
            "embedding_multiplier": _positive_number("embedding_multiplier"),
            "residual_multiplier": _positive_number("residual_multiplier"),
            "logits_scaling": _positive_number("logits_scaling"),
            "attention_scale": _positive_number("attention_multiplier"),
        },
    ),
    FamilyAdapter(
        model_type="olmo2",
        genai_type="olmo",  # onnxruntime-genai has no "olmo2"; its generic path runs the graph
        config_overrides={"norm_placement": "post", "qk_norm": True, "qk_norm_per_head": False},
    ),
    FamilyAdapter(
        model_type="starcoder2",
        genai_type="decoder",  # onnxruntime-genai has no "starcoder2"; its generic path runs it
        config_defaults={
            "tie_word_embeddings": True,
            "hidden_act": "gelu_pytorch_tanh",
            "norm_epsilon": 1e-5,
        },
        config_overrides={
            "norm_type": "layer",
            "gated_mlp": False,
            "qkv_bias": _switch("use_bias", True),
            "o_bias": _switch("use_bias", True),
            "mlp_bias": _switch("use_bias", True),
        },
        weight_renames=((r"\.mlp\.fc1\.", ".mlp.c_fc."), (r"\.mlp\.fc2\.", ".mlp.c_proj.")),
    ),
    FamilyAdapter(
        model_type="stablelm",
        genai_type="decoder",  # onnxruntime-genai has no "stablelm"; its generic path runs it
        config_defaults={"partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5},
        config_overrides={
            "head_dim": _hidden_over_heads,
            "norm_type": "layer",
            "qkv_bias": _switch("use_qkv_bias", False),
            "o_bias": False,
            "mlp_bias": False,
            "parallel_residual": _switch("use_parallel_residual", False),
            "qk_norm": _switch("qk_layernorm", False),
            "qk_norm_head_weights": _switch("qk_layernorm", False),
        },
        weight_renames=((r"\.self_attn\.(q|k)_norm\.", r".self_attn.\1_layernorm."),),
    ),
    FamilyAdapter(
        model_type="olmo",
        genai_type="olmo",
        config_overrides={
            "norm_type": "layer_no_affine",
            "norm_eps": 1e-5,  # OlmoLayerNorm's fixed epsilon; config.json names none
            "mlp_bias": False,
            "clip_qkv": _optional_positive("clip_qkv"),
        },
    ),
    FamilyAdapter(
        model_type="gpt_neox",
        genai_type="decoder",  # onnxruntime-genai has no "gpt_neox"; its generic path runs it
        config_aliases={"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},
        config_defaults={
            "partial_rotary_factor": 0.25,
            "layer_norm_eps": 1e-5,
            "hidden_act": "gelu",
            "attention_bias": True,
        },
        config_overrides={
            "head_dim": _hidden_over_heads,
            "num_key_value_heads": lambda raw: _require(raw, "num_attention_heads"),
            "norm_type": "layer",
            "gated_mlp": False,
            "mlp_bias": True,
            "packed_qkv": True,
            "parallel_residual": _switch("use_parallel_residual", True),
            "parallel_mlp_norm": _switch("use_parallel_residual", True),
        },
        weight_renames=(
            (r"\.self_attn\.qkv_proj\.", ".attention.query_key_value."),
            (r"\.self_attn\.o_proj\.", ".attention.dense."),
            (r"\.mlp\.fc1\.", ".mlp.dense_h_to_4h."),
            (r"\.mlp\.fc2\.", ".mlp.dense_4h_to_h."),
            (r"^model\.layers\.", "gpt_neox.layers."),
            (r"^model\.embed_tokens\.", "gpt_neox.embed_in."),
            (r"^model\.norm\.", "gpt_neox.final_layer_norm."),
            (r"^lm_head\.", "embed_out."),
        ),
        # GPTNeoXPreTrainedModel's _keys_to_ignore_on_load_unexpected
        unused_weights=(r"\.attention\.(bias|masked_bias)$",),
        preprocess_weight=_qkv_blocks_from_head_rows,
        preprocessed_weights=_PACKED_QKV,
    ),
    FamilyAdapter(
        model_type="nemotron",
        genai_type="nemotron",
        config_defaults={"partial_rotary_factor": 0.5, "norm_eps": 1e-5, "hidden_act": "relu2"},
        config_overrides={"norm_type": "layer", "gated_mlp": False},
        weight_renames=((r"\.mlp\.fc1\.", ".mlp.up_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj.")),
        # NemotronLayerNorm1P scales by 1 + weight, as gemma's RMSNorm does
        preprocess_weight=_offset_norm_weights,
        preprocessed_weights=_NORM_WEIGHTS,
    ),
    FamilyAdapter(
        model_type="exaone",
        genai_type="decoder",  # onnxruntime-genai has no "exaone"; its generic path runs it
        # (layer_norm_epsilon, EXAONE's name for rms_norm_eps, is one of config.py's eps keys)
        config_aliases={"num_layers": "num_hidden_layers", "activation_function": "hidden_act"},
        config_defaults={
            "rope_theta": 500_000.0,
            "norm_eps": 1e-5,  # the last eps key config.py reads: used when no other is given
            # ExaoneConfig's default is 8 heads; an explicit null means one per query head
            "num_key_value_heads": _exaone_kv_heads,
        },
        # transformers runs exaone as llama; checkpoints keep EXAONE's GPT-2-style names
        weight_renames=(
            (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
            (r"\.self_attn\.", ".attn.attention."),
            (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
            (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."),
            (r"\.mlp\.down_proj\.", ".mlp.c_proj."),
            (r"\.post_attention_layernorm\.", ".ln_2."),
            *_GPT2_LAYOUT,
        ),
    ),
    FamilyAdapter(
        model_type="gptj",
        genai_type="decoder",  # onnxruntime-genai has no "gptj"; its generic path runs it
        config_aliases=_GPT2_CONFIG_NAMES,
        config_defaults={
            "intermediate_size": lambda raw: 4 * _require(raw, "hidden_size"),
            "hidden_act": "gelu_new",
            "layer_norm_epsilon": 1e-5,
            "partial_rotary_factor": _gptj_partial_rotary,
        },
        config_overrides={
            "head_dim": _hidden_over_heads,
            "num_key_value_heads": lambda raw: _require(raw, "num_attention_heads"),
            "norm_type": "layer",
            "parallel_residual": True,  # one shared norm (ln_1) feeds attention and MLP
            "gated_mlp": False,
            "qkv_bias": False,
            "o_bias": False,
            "mlp_bias": True,
            "lm_head_bias": True,
            "rope_interleaved": True,  # rotate_every_two
        },
        # GPTJRotaryEmbedding ignores rope scaling: a checkpoint that asks for it is refused
        refused_keys=("rope_scaling",),
        weight_renames=(
            (r"\.self_attn\.o_proj\.", ".attn.out_proj."),
            (r"\.self_attn\.", ".attn."),
            (r"\.mlp\.fc1\.", ".mlp.fc_in."),
            (r"\.mlp\.fc2\.", ".mlp.fc_out."),
            *_GPT2_LAYOUT,
        ),
        unused_weights=_GPT2_BUFFERS,
    ),
    FamilyAdapter(
        model_type="cohere",
        genai_type="decoder",  # onnxruntime-genai has no "cohere"; its generic path runs it
        config_defaults={
            "tie_word_embeddings": True,
            "layer_norm_eps": 1e-5,
            "rope_theta": 500_000.0,  # CohereConfig's default_theta
        },
        config_overrides={
            "norm_type": "layer_no_bias",
            "parallel_residual": True,  # one shared norm (input_layernorm)
            "mlp_bias": False,
            "logits_scaling": _inverse_logit_scale,
            "qk_norm": _switch("use_qk_norm", False),
            "qk_norm_head_weights": _switch("use_qk_norm", False),
            "qk_norm_stacked_weights": _switch("use_qk_norm", False),
            "rope_interleaved": True,  # repeat_interleave'd tables, rotate_half on pairs
        },
    ),
    FamilyAdapter(
        model_type="glm",
        genai_type="decoder",  # onnxruntime-genai's "chatglm" is another model; "decoder" runs it
        config_defaults={
            "head_dim": 128,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1.5625e-7,
            "partial_rotary_factor": 0.5,
            "attention_bias": True,
            "eos_token_id": [151329, 151336, 151338],
        },
        config_overrides={"o_bias": False, "mlp_bias": False, "rope_interleaved": True},
        fused_weights=(
            FusedWeight(
                r"\.mlp\.(?P<part>gate|up)_proj\.weight$",
                ".mlp.gate_up_proj.weight",
                ("gate", "up"),
            ),
        ),
    ),
    FamilyAdapter(
        model_type="arcee",
        genai_type="decoder",  # onnxruntime-genai has no "arcee"; its generic path runs it
        config_defaults={"hidden_act": "relu2", "rms_norm_eps": 1e-5},
        config_overrides={"gated_mlp": False},  # down(act(up(x))): llama without the gate
        weight_renames=((r"\.mlp\.fc1\.", ".mlp.up_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj.")),
    ),
    FamilyAdapter(
        model_type="helium",
        genai_type="decoder",  # onnxruntime-genai has no "helium"; its generic path runs it
        config_defaults={
            "head_dim": 128,
            "num_key_value_heads": 20,
            "rms_norm_eps": 1e-8,
            "rope_theta": 100_000.0,  # HeliumConfig's default_theta
        },
        # rotate_half on adjacent pairs with repeat_interleave'd tables; o_proj never has a bias
        config_overrides={"o_bias": False, "rope_interleaved": True},
    ),
    FamilyAdapter(
        model_type="ernie4_5",
        genai_type="decoder",  # onnxruntime-genai has no "ernie4_5"; its generic path runs it
        config_defaults={
            "head_dim": _when_absent("head_dim", 128),
            "num_key_value_heads": _when_absent("num_key_value_heads", 2),
            "rms_norm_eps": 1e-5,
            "rope_theta": 500_000.0,  # Ernie4_5Config's default_theta
            "tie_word_embeddings": True,
        },
        config_overrides={
            "qkv_bias": _switch("use_bias", False),
            "o_bias": _switch("use_bias", False),
            "mlp_bias": _switch("use_bias", False),
            "rope_interleaved": True,  # glm's rotate_half with repeat_interleave'd tables
        },
    ),
    FamilyAdapter(
        model_type="seed_oss",
        genai_type="decoder",  # onnxruntime-genai has no "seed_oss"; its generic path runs it
        config_defaults={
            "head_dim": _when_absent("head_dim", 128),
            "num_key_value_heads": _when_absent("num_key_value_heads", 8),
        },
        config_overrides={
            "qkv_bias": _switch("attention_bias", True),
            "o_bias": _switch("attention_out_bias", False),
        },
    ),
    FamilyAdapter(
        model_type="olmo3",
        genai_type="olmo",  # as olmo2: onnxruntime-genai's generic path runs the graph
        config_defaults={
            "rms_norm_eps": 1e-5,
            "rope_theta": 500_000.0,  # Olmo3Config's default_theta
            "sliding_window": 4096,
            "layer_types": _alternating_layer_types(4),  # every 4th layer full attention
        },
        config_overrides={
            "norm_placement": "post",
            "qk_norm": True,
            "qk_norm_per_head": False,
            "rope_local": _olmo3_rope_local,
        },
    ),
    FamilyAdapter(
        model_type="exaone4",
        genai_type="decoder",  # onnxruntime-genai has no "exaone4"; its generic path runs it
        config_defaults={
            "num_key_value_heads": 32,
            "rms_norm_eps": 1e-5,
            "sliding_window": lambda raw: None if "sliding_window" in raw else 4096,
        },
        config_overrides={
            # olmo2's layer: block → norm → add, per-head q/k RMSNorms shared by the heads
            "norm_placement": "post",
            "qk_norm": True,
            "qkv_bias": False,
            "o_bias": False,
            "mlp_bias": False,
            "layer_types": _exaone4_layer_types,
            "no_rope_layers": _exaone4_no_rope_layers,
        },
    ),
    FamilyAdapter(
        model_type="hunyuan_v1_dense",
        genai_type="decoder",  # onnxruntime-genai has no "hunyuan_v1_dense"; "decoder" runs it
        config_defaults={"rms_norm_eps": 1e-5},
        config_overrides={
            # per-head RMSNorms shared by the heads, applied to the rotated q and k
            "qk_norm": True,
            "qk_norm_after_rope": True,
            "mlp_bias": False,
            "rope": _ntk_alpha_rope,
        },
        weight_renames=(
            (r"\.self_attn\.q_norm\.", ".self_attn.query_layernorm."),
            (r"\.self_attn\.k_norm\.", ".self_attn.key_layernorm."),
        ),
    ),
    FamilyAdapter(
        model_type="internlm3",
        genai_type="decoder",  # onnxruntime-genai has no "internlm3"; its generic path runs it
        config_aliases={"qkv_bias": "attention_bias", "bias": "mlp_bias"},
        config_defaults={
            "head_dim": _when_absent("head_dim", 128),
            "num_key_value_heads": _when_absent("num_key_value_heads", 2),
            "rms_norm_eps": 1e-5,
        },
        # transformers runs internlm3 checkpoints as llama
        config_overrides={"qkv_bias": _internlm3_bias},
    ),
    FamilyAdapter(
        model_type="vaultgemma",
        genai_type="decoder",  # onnxruntime-genai has no "vaultgemma"; its generic path runs it
        config_defaults={
            "tie_word_embeddings": True,
            "head_dim": 256,
            "num_key_value_heads": 4,
            "sliding_window": _when_absent("sliding_window", 4096),
            "layer_types": _alternating_layer_types(2),
            # VaultGemmaConfig's softcaps when absent; null turns them off
            "attn_logit_softcapping": _when_absent("attn_logit_softcapping", 50.0),
            "final_logit_softcapping": _when_absent("final_logit_softcapping", 30.0),
        },
        # gemma2 without the post-attention and post-MLP norms: a pre-norm layer whose MLP
        # norm keeps gemma2's name, pre_feedforward_layernorm
        config_overrides={**_GEMMA2_OVERRIDES, "norm_placement": "pre"},
        weight_renames=((r"\.post_attention_layernorm\.", ".pre_feedforward_layernorm."),),
        preprocess_weight=_offset_norm_weights,
        preprocessed_weights=_NORM_WEIGHTS,
    ),
    FamilyAdapter(
        model_type="smollm3",
        genai_type="smollm3",
        config_defaults={"tie_word_embeddings": True},
        config_overrides={"no_rope_layers": _smollm3_no_rope_layers},
    ),
)

FAMILIES: dict[str, FamilyAdapter] = {family.model_type: family for family in _FAMILIES}


def get_family(model_type: str) -> FamilyAdapter:
    """The adapter for `model_type`, or an error listing the supported ones."""
    _model_type(model_type)
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}"
        ) from None
