"""ArchitectureConfig: one normalized, validated description of a decoder architecture.

config.json comes in two layouts: the one hub checkpoints carry (`rope_theta`, `rope_scaling`,
`torch_dtype`) and the one transformers 5 writes (`rope_parameters`, `dtype`). Both parse to the
same ArchitectureConfig, so nothing downstream depends on transformers or on its release.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_genai._json import read_json_object
from mobius_genai.errors import ConfigError

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")
HIDDEN_ACTS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "relu2")
NORM_TYPES = ("rms", "layer", "layer_no_bias", "layer_no_affine")
NORM_PLACEMENTS = ("pre", "sandwich", "post")
POSITION_EMBEDDINGS = ("rope", "learned")
# Rope types whose tables depend on the length the model was pretrained with.
_ROPE_TYPES_WITH_ORIGINAL = ("llama3", "yarn", "longrope")
# Keys transformers' rope validation requires per type; rope_theta and
# original_max_position_embeddings get defaults, longrope's factor lists are checked in
# _validate_rope, and yarn without factor derives it (as transformers' yarn init does).
_ROPE_REQUIRED_KEYS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}
_NORM_EPS_KEYS = (
    "rms_norm_eps",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "norm_epsilon",
    "norm_eps",
)


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding: base, scaling and the part of each head it rotates."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    partial_rotary_factor: float = 1.0
    interleaved: bool = False


@dataclasses.dataclass(frozen=True)
class ArchitectureConfig:
    """What the graph builder needs to know about a decoder-only LM, and nothing else.

    Beyond sizes, a few generic switches describe how families differ (each defaults to the
    llama-style decoder):

    - `norm_type`: "rms" (RMSNormalization), "layer" (LayerNormalization with bias),
      "layer_no_bias" (LayerNormalization with a weight and no bias: cohere) or
      "layer_no_affine" (LayerNormalization without learnable weight or bias: olmo).
    - `norm_placement`: where a layer normalizes. "pre": norm → block → add (llama);
      "sandwich": norm → block → norm → add (gemma2/3); "post": block → norm → add (olmo2).
    - `parallel_residual`: attention and MLP read the same normed input and both outputs are
      added to the residual at once, x + attn(ln(x)) + mlp(ln(x)) (phi); needs placement "pre".
    - `parallel_mlp_norm`: with `parallel_residual`, the MLP normalizes the layer input with a
      norm of its own, x + attn(ln1(x)) + mlp(ln2(x)) (gpt_neox), instead of reading the
      attention's normed input.
    - `gated_mlp`: down(act(gate(x)) * up(x)) when True, fc2(act(fc1(x))) when False.
    - `embedding_multiplier`: token embeddings are multiplied by it (gemma: sqrt(hidden_size),
      granite: `embedding_multiplier`).
    - `residual_multiplier`: each block's output is multiplied by it before the residual add
      (granite).
    - `logits_scaling`: logits are divided by it (granite).
    - `position_embedding`: "rope", or "learned" absolute positions added to the token
      embeddings (gpt2); "learned" means no rotary in any layer.
    - `no_rope_layers`: indices of layers that apply no rotary embedding (smollm3's NoPE layers).
    - `rope_local`: the rope of sliding-window layers when it differs from `rope` (gemma3's
      `rope_local_base_freq`); None means every layer uses `rope`.
    - `qk_norm_per_head`: with `qk_norm`, normalize each head's q/k (qwen3, gemma3) when True,
      the whole q/k projection at once (olmo2) when False.
    - `qk_norm_head_weights`: with per-head `qk_norm`, every head has its own norm weight and
      the q/k norms no bias (stablelm's per-head LayerNorms); one weight shared by all heads
      when False.
    - `qk_norm_stacked_weights`: with `qk_norm_head_weights`, the per-head weights are one
      [num_heads, head_dim] tensor `q_norm.weight` (cohere) instead of one tensor per head.
    - `qk_norm_after_rope`: with `qk_norm`, q and k are normalized after the rotary embedding
      (hunyuan_v1_dense) instead of before it.
    - `rope_interleaved`: every rope of the config rotates adjacent channel pairs
      (x0, x1), (x2, x3), ... (gptj, cohere, glm) instead of the two halves of the rotated
      channels (llama's rotate_half).
    - `packed_qkv`: q, k and v come from one projection `qkv_proj` whose output is
      [q | k | v], split in the graph (gpt_neox's query_key_value, whose per-head rows the
      adapter regroups into these blocks as it reads them).
    - `clip_qkv`: q, k and v projections are clipped to [-clip_qkv, clip_qkv] right after
      the projection (olmo); None means no clipping.
    - `lm_head_bias`: the LM head adds a bias (phi).
    - `attention_scale`: softmax scale when not 1/sqrt(head_dim) (gemma2/3's
      query_pre_attn_scalar**-0.5, granite's attention_multiplier).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    hidden_act: str = "silu"
    norm_eps: float = 1e-6
    rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    qk_norm_per_head: bool = True
    qk_norm_head_weights: bool = False
    qk_norm_stacked_weights: bool = False
    qk_norm_after_rope: bool = False
    packed_qkv: bool = False
    clip_qkv: float | None = None
    lm_head_bias: bool = False
    tie_word_embeddings: bool = False
    norm_type: str = "rms"
    norm_placement: str = "pre"
    parallel_residual: bool = False
    parallel_mlp_norm: bool = False
    gated_mlp: bool = True
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    position_embedding: str = "rope"
    no_rope_layers: tuple[int, ...] = ()
    rope_local: RopeConfig | None = None
    rope_interleaved: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    attention_scale: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_hidden_layers)
        if self.rope_interleaved:
            for name in ("rope", "rope_local"):
                rope = getattr(self, name)
                if rope is not None and not rope.interleaved:
                    object.__setattr__(self, name, dataclasses.replace(rope, interleaved=True))
        _validate(self)

    @property
    def rotary_dim(self) -> int:
        """Number of channels of each head that rotary embedding rotates (even)."""
        return self.rotary_dim_of(self.rope)

    def rotary_dim_of(self, rope: RopeConfig) -> int:
        """Number of channels of each head that `rope` rotates (even)."""
        dim = rotated_channels(self.head_dim, rope.partial_rotary_factor)
        return dim - dim % 2

    @property
    def scale(self) -> float:
        """Softmax scale of attention scores."""
        if self.attention_scale is not None:
            return self.attention_scale
        return 1.0 / math.sqrt(self.head_dim)

    def rope_of_layer(self, index: int) -> RopeConfig | None:
        """The rope of layer `index`, or None when the layer applies no rotary embedding."""
        if self.position_embedding != "rope" or index in self.no_rope_layers:
            return None
        if self.rope_local is not None and self.layer_types[index] == "sliding_attention":
            return self.rope_local
        return self.rope

    def window_of_layer(self, index: int) -> int | None:
        """Sliding-window size of layer `index`, or None for full attention."""
        if self.layer_types[index] == "sliding_attention":
            return self.sliding_window
        return None

    def layer_kind(self, index: int) -> tuple[str, bool]:
        """What makes layer `index` differ from others: its attention type and whether it
        applies a rotary embedding (a sliding layer's rope follows from its type)."""
        return self.layer_types[index], self.rope_of_layer(index) is not None

    def layers_of_every_kind(self) -> int:
        """The fewest first layers that hold every kind of layer the model has (`layer_kind`):
        a model cut to them builds, and runs, every kind of layer of the whole one."""
        kinds = [self.layer_kind(index) for index in range(self.num_hidden_layers)]
        missing = set(kinds)
        for count, kind in enumerate(kinds, 1):
            missing.discard(kind)
            if not missing:
                return count
        return self.num_hidden_layers

    def first_layers(self, count: int) -> ArchitectureConfig:
        """The same architecture with only its first `count` layers (the smoke test's twin)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"layer count must be a positive integer, found {count!r}")
        if count > self.num_hidden_layers:
            raise ConfigError(
                f"layer count {count} is above the model's {self.num_hidden_layers} layers; "
                f"accepted: 1..{self.num_hidden_layers}"
            )
        return dataclasses.replace(
            self,
            num_hidden_layers=count,
            layer_types=self.layer_types[:count],
            no_rope_layers=tuple(index for index in self.no_rope_layers if index < count),
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], **overrides: Any) -> ArchitectureConfig:
        """Parse a config.json dict (hub or transformers-5 layout).

        `overrides` are applied after parsing; family adapters use them for facts the family
        fixes that config.json does not spell out (e.g. qwen2 always has q/k/v biases).
        """
        fields = _parse(raw)
        fields.update(overrides)
        try:
            return cls(**fields)
        except TypeError as error:
            raise ConfigError(f"config.json: {error}") from error

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> ArchitectureConfig:
        """Read and parse a config.json file."""
        return cls.from_dict(read_config_json(path), **overrides)


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Load config.json as a dict with errors that name the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: config.json not found; a checkpoint folder must hold one")
    return read_json_object(path, ConfigError)


def rotated_channels(head_dim: int, partial_rotary_factor: float) -> int:
    """int(head_dim * partial_rotary_factor): the channels transformers rotates."""
    return int(head_dim * partial_rotary_factor)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _model_type(value: Any) -> str:
    """config.json's model_type, which must be a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(
            "config.json: field 'model_type' is required and must be a non-empty string, "
            f"found {value!r}"
        )
    return value


def _require(raw: Mapping[str, Any], key: str) -> int:
    """raw[key], a required positive integer."""
    if raw.get(key) is None:
        raise ConfigError(f"config.json: field {key!r} is required and missing")
    return _integer(raw[key], key)


def _integer(value: Any, key: str, default: Any = None, *, positive: bool = True) -> Any:
    """`value` of field `key` as a positive (or non-negative) int; null gives `default`."""
    if value is None:
        return default
    if not _is_int(value) or value < (1 if positive else 0):
        accepted = "a positive integer" if positive else "a non-negative integer"
        raise ConfigError(f"config.json: field {key!r} must be {accepted}, found {value!r}")
    return value


def _number(value: Any, key: str, default: Any = None, *, positive: bool = False) -> Any:
    """`value` of field `key` as a finite (optionally positive) float; null gives `default`."""
    if value is None:
        return default
    if not _is_number(value) or (positive and value <= 0):
        accepted = "a positive number" if positive else "a number"
        raise ConfigError(f"config.json: field {key!r} must be {accepted}, found {value!r}")
    return float(value)


def _flag(value: Any, key: str, default: bool) -> bool:
    """`value` of field `key` as a bool; null gives `default`."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"config.json: field {key!r} must be true or false, found {value!r}")
    return value


def _mapping(value: Any, key: str) -> dict[str, Any]:
    """`value` of field `key` as a dict; null gives {}."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"config.json: field {key!r} must be an object, found {value!r}")
    return dict(value)


def _float_tuple(value: Any, key: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(_is_number(v) for v in value):
        raise ConfigError(f"config.json: field {key!r} must be a list of numbers, found {value!r}")
    return tuple(float(v) for v in value)


def _int_tuple(value: Any, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if not all(_is_int(v) for v in values):
        raise ConfigError(
            f"config.json: field {key!r} must be an int or list of ints, found {value!r}"
        )
    return tuple(values)


def _parse_rope(raw: Mapping[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    """The rope of full-attention layers and, when it differs, the rope of sliding layers.

    transformers 5 nests `rope_parameters` by layer type for models whose local and global
    layers rotate differently (gemma3): {"full_attention": {...}, "sliding_attention": {...}};
    hub checkpoints of gemma3 give the local base as `rope_local_base_freq` instead, the rope
    scaling applying to global layers only.
    """
    params = _mapping(raw.get("rope_parameters"), "rope_parameters")
    if any(key in LAYER_TYPES for key in params):
        full, local = (f"rope_parameters.{key}" for key in LAYER_TYPES)
        rope = _rope_from_params(raw, _mapping(params.get("full_attention"), full), full)
        local_params = _mapping(params.get("sliding_attention"), local)
        return rope, _rope_from_params(raw, local_params, local) if local_params else None
    scaling = _mapping(raw.get("rope_scaling"), "rope_scaling")
    params.update({k: v for k, v in scaling.items() if v is not None})
    rope = _rope_from_params(raw, params, "rope_scaling" if scaling else "rope_parameters")
    # the hub layout of gemma3's local rope
    local_theta = _number(raw.get("rope_local_base_freq"), "rope_local_base_freq", positive=True)
    if local_theta is None:
        return rope, None
    local_params = {"rope_type": "default", "rope_theta": local_theta}
    return rope, _rope_from_params(raw, local_params, "rope_local_base_freq")


def _rope_from_params(raw: Mapping[str, Any], params: dict[str, Any], source: str) -> RopeConfig:
    """One RopeConfig from a rope-parameters dict read from the config.json field `source`.

    Defaults follow transformers' `standardize_rope_params` and rope init functions: scaled
    types without `original_max_position_embeddings` use max_position_embeddings (a top-level
    `original_max_position_embeddings`, as phi3 has, takes precedence), and longrope or yarn
    without `factor` use max_position_embeddings / original_max_position_embeddings.
    rope_theta and partial_rotary_factor absent from `params` come from the top level.
    """

    def number(key: str, default: Any = None, *, positive: bool = False, top_level: bool = False):
        if top_level and params.get(key) is None:
            return _number(raw.get(key), key, default, positive=positive)
        return _number(params.get(key), f"{source}.{key}", default, positive=positive)

    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "su":  # phi3's early name for longrope
        rope_type = "longrope"
    if rope_type not in ROPE_TYPES:
        raise ConfigError(
            f"config.json: rope type {rope_type!r} is not supported; accepted: {list(ROPE_TYPES)}"
        )
    missing = [key for key in _ROPE_REQUIRED_KEYS.get(rope_type, ()) if params.get(key) is None]
    if missing:
        raise ConfigError(
            f"config.json: field '{source}.{missing[0]}' is required for {rope_type!r} rope "
            "scaling and missing"
        )
    key = "original_max_position_embeddings"
    original = _integer(raw.get(key), key) or _integer(params.get(key), f"{source}.{key}")
    if original is None and rope_type in _ROPE_TYPES_WITH_ORIGINAL:
        original = raw["max_position_embeddings"]
    factor = number("factor")
    if factor is None and rope_type in ("longrope", "yarn") and original:
        factor = raw["max_position_embeddings"] / original
    return RopeConfig(
        theta=number("rope_theta", 10000.0, positive=True, top_level=True),
        type=rope_type,
        factor=factor if factor is not None else 1.0,
        original_max_position_embeddings=original,
        low_freq_factor=number("low_freq_factor", 1.0, positive=True),
        high_freq_factor=number("high_freq_factor", 4.0, positive=True),
        beta_fast=number("beta_fast") or 32.0,
        beta_slow=number("beta_slow") or 1.0,
        attention_factor=number("attention_factor"),
        mscale=number("mscale"),
        mscale_all_dim=number("mscale_all_dim"),
        truncate=_flag(params.get("truncate"), f"{source}.truncate", True),
        short_factor=_float_tuple(params.get("short_factor"), f"{source}.short_factor"),
        long_factor=_float_tuple(params.get("long_factor"), f"{source}.long_factor"),
        partial_rotary_factor=number("partial_rotary_factor", 1.0, top_level=True),
    )


def _parse_layer_types(raw: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    if not _flag(raw.get("use_sliding_window"), "use_sliding_window", True):
        # transformers drops the window when use_sliding_window is off, whatever layer_types say
        return ("full_attention",) * num_layers
    layer_types = raw.get("layer_types")
    if layer_types is not None and not isinstance(layer_types, list | tuple):
        raise ConfigError(
            f"config.json: field 'layer_types' must be a list, found {layer_types!r}; accepted: "
            f"one of {list(LAYER_TYPES)} per layer"
        )
    if layer_types:
        return tuple(layer_types)
    if raw.get("sliding_window") is None:
        return ("full_attention",) * num_layers
    first_sliding = 0
    if "use_sliding_window" in raw:
        first_sliding = _integer(
            raw.get("max_window_layers"), "max_window_layers", 0, positive=False
        )
    return tuple(
        "sliding_attention" if i >= first_sliding else "full_attention" for i in range(num_layers)
    )


def _parse(raw: Mapping[str, Any]) -> dict[str, Any]:
    model_type = _model_type(raw.get("model_type"))
    hidden = _require(raw, "hidden_size")
    heads = _require(raw, "num_attention_heads")
    num_layers = _require(raw, "num_hidden_layers")
    max_positions = _require(raw, "max_position_embeddings")
    kv_heads = _integer(raw.get("num_key_value_heads"), "num_key_value_heads", heads)
    head_dim = _integer(raw.get("head_dim"), "head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(
                f"config.json: hidden_size {hidden} is not divisible by num_attention_heads "
                f"{heads}; accepted: a divisor of hidden_size, or an explicit head_dim"
            )
        head_dim = hidden // heads
    layer_types = _parse_layer_types(raw, num_layers)
    has_sliding = "sliding_attention" in layer_types
    rope, rope_local = _parse_rope(raw)
    eps_key = next((key for key in _NORM_EPS_KEYS if raw.get(key) is not None), _NORM_EPS_KEYS[0])
    return {
        "model_type": model_type,
        "vocab_size": _require(raw, "vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": _require(raw, "intermediate_size"),
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "hidden_act": raw.get("hidden_act", raw.get("hidden_activation", "silu")),
        "norm_eps": _number(raw.get(eps_key), eps_key, 1e-6, positive=True),
        "rope": rope,
        "rope_local": rope_local,
        "qkv_bias": _flag(raw.get("attention_bias"), "attention_bias", False),
        "o_bias": _flag(raw.get("attention_bias"), "attention_bias", False),
        "mlp_bias": _flag(raw.get("mlp_bias"), "mlp_bias", False),
        "tie_word_embeddings": _flag(raw.get("tie_word_embeddings"), "tie_word_embeddings", False),
        "sliding_window": raw.get("sliding_window") if has_sliding else None,
        "layer_types": layer_types,
        "attn_logit_softcapping": _number(
            raw.get("attn_logit_softcapping"), "attn_logit_softcapping"
        ),
        "final_logit_softcapping": _number(
            raw.get("final_logit_softcapping"), "final_logit_softcapping"
        ),
        "bos_token_id": raw.get("bos_token_id"),
        "eos_token_id": _int_tuple(raw.get("eos_token_id"), "eos_token_id"),
        "pad_token_id": raw.get("pad_token_id"),
        "torch_dtype": raw.get("torch_dtype", raw.get("dtype")),
    }


def _validate(config: ArchitectureConfig) -> None:
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
        if not _is_int(value) or value <= 0:
            raise ConfigError(
                f"config.json: field {name!r} must be a positive integer, found {value!r}"
            )
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConfigError(
            f"config.json: num_attention_heads {config.num_attention_heads} is not divisible by "
            f"num_key_value_heads {config.num_key_value_heads}; accepted: a divisor of the "
            "attention head count"
        )
    if config.hidden_act not in HIDDEN_ACTS:
        raise ConfigError(
            f"config.json: hidden_act {config.hidden_act!r} is not supported; accepted: "
            f"{list(HIDDEN_ACTS)}"
        )
    if len(config.layer_types) != config.num_hidden_layers:
        raise ConfigError(
            f"config.json: layer_types has {len(config.layer_types)} entries for "
            f"{config.num_hidden_layers} layers; accepted: one entry per layer"
        )
    unknown = [kind for kind in config.layer_types if kind not in LAYER_TYPES]
    if unknown:
        raise ConfigError(
            f"config.json: layer_types holds {unknown}; accepted: {list(LAYER_TYPES)}"
        )
    if "sliding_attention" in config.layer_types and (
        not _is_int(config.sliding_window) or config.sliding_window <= 0
    ):
        raise ConfigError(
            f"config.json: sliding_window must be a positive integer for sliding layers, "
            f"found {config.sliding_window!r}"
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
    if config.parallel_residual and config.norm_placement != "pre":
        raise ConfigError(
            f"config.json: a parallel residual needs norm_placement 'pre', found "
            f"{config.norm_placement!r}"
        )
    if config.parallel_mlp_norm and not config.parallel_residual:
        raise ConfigError(
            "config.json: a separate MLP norm of the parallel residual (parallel_mlp_norm) needs "
            "parallel_residual, found parallel_residual False"
        )
    outside = [i for i in config.no_rope_layers if not 0 <= i < config.num_hidden_layers]
    if outside:
        raise ConfigError(
            f"config.json: no_rope_layers holds {outside}; accepted: layer indices 0.."
            f"{config.num_hidden_layers - 1}"
        )
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
    if config.clip_qkv is not None and (not _is_number(config.clip_qkv) or config.clip_qkv <= 0):
        raise ConfigError(
            f"config.json: clip_qkv must be a positive number or null, found {config.clip_qkv!r}"
        )
    for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
        value = getattr(config, name)
        if not _is_number(value) or value <= 0:
            raise ConfigError(f"config.json: {name} must be a positive number, found {value!r}")
    for rope in (config.rope, config.rope_local):
        if rope is not None:
            _validate_rope(rope, config.head_dim)


def _validate_rope(rope: RopeConfig, head_dim: int) -> None:
    rotary_dim = rotated_channels(head_dim, rope.partial_rotary_factor)
    if rotary_dim < 2 or not 0.0 < rope.partial_rotary_factor <= 1.0:
        raise ConfigError(
            f"config.json: partial_rotary_factor {rope.partial_rotary_factor} must be in "
            "(0, 1] and leave at least two rotated channels"
        )
    if rope.type in ("linear", "dynamic", "llama3", "yarn") and rope.factor <= 0:
        raise ConfigError(
            f"config.json: rope factor must be positive for {rope.type!r} scaling, "
            f"found {rope.factor}"
        )
    if rope.type == "longrope":
        if rope.short_factor is None or rope.long_factor is None:
            raise ConfigError(
                "config.json: longrope scaling needs both 'short_factor' and 'long_factor'"
            )
        pairs = (rotary_dim - rotary_dim % 2) // 2
        for name in ("short_factor", "long_factor"):
            if len(getattr(rope, name)) != pairs:
                raise ConfigError(
                    f"config.json: longrope {name} has {len(getattr(rope, name))} entries; "
                    f"accepted: one per rotated channel pair ({pairs})"
                )
