"""config.json keys that only some transformers classes read.

The generic reader would turn each into graph math for every family; a row lists in
`FamilyAdapter.family_keys` those its transformers class reads, and the others are dropped
from config.json before parsing, so a key the class ignores changes nothing (a
`partial_rotary_factor` in a llama config.json: LlamaRotaryEmbedding turns whole heads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: The key of families whose rotary embedding turns `partial_rotary_factor` of each head.
PARTIAL_ROTARY = "partial_rotary_factor"
#: The switch of the families whose config class reads it (Qwen2Config: no window unless it is
#: on, then sliding from `max_window_layers` on). The others' classes ignore both keys, while
#: transformers' cache (DynamicCache) still keeps only the last `sliding_window` tokens of
#: every layer `layer_types` calls sliding (all of them without layer_types): their decoding is
#: windowed whatever the switch says, so `sliding_window` and `layer_types` are never dropped.
USE_SLIDING_WINDOW = "use_sliding_window"
#: The key of families whose MLP takes `mlp_bias` (the others' Linear layers have no bias).
MLP_BIAS = "mlp_bias"
_ROPE_DICTS = ("rope_parameters", "rope_scaling")
#: `config_overrides` of the rows whose attention projections never have a bias: most classes
#: read `attention_bias` (llama's), so the few that ignore it fix it off rather than opt in.
UNBIASED_ATTENTION = {"qkv_bias": False, "o_bias": False}


def _drop_partial_rotary(raw: dict[str, Any]) -> None:
    """Drop partial_rotary_factor from the top level and from every rope dict (transformers 5
    moves the top-level key into `rope_parameters`, nested per layer type or not)."""
    raw.pop(PARTIAL_ROTARY, None)
    for name in _ROPE_DICTS:
        params = raw.get(name)
        if not isinstance(params, Mapping):
            continue
        params = {
            key: (
                {k: v for k, v in value.items() if k != PARTIAL_ROTARY}
                if isinstance(value, Mapping)
                else value
            )
            for key, value in params.items()
            if key != PARTIAL_ROTARY
        }
        raw[name] = params


def _drop_sliding_switch(raw: dict[str, Any]) -> None:
    raw.pop(USE_SLIDING_WINDOW, None)
    raw.pop("max_window_layers", None)


def _drop_mlp_bias(raw: dict[str, Any]) -> None:
    raw.pop(MLP_BIAS, None)


#: Each gated key → how config.json is cleared of it.
_DROPS: dict[str, Callable[[dict[str, Any]], None]] = {
    PARTIAL_ROTARY: _drop_partial_rotary,
    USE_SLIDING_WINDOW: _drop_sliding_switch,
    MLP_BIAS: _drop_mlp_bias,
}
FAMILY_KEYS = frozenset(_DROPS)
#: What every config class that reads a gated key fills in when config.json lacks it (Qwen2's,
#: Qwen3's, their MoE's and SmolLM3's: no window unless switched on).
_READ_DEFAULTS = {USE_SLIDING_WINDOW: False}
#: `family_keys` of the rows whose rotary embedding reads partial_rotary_factor.
READS_PARTIAL_ROTARY = frozenset({PARTIAL_ROTARY})
#: `family_keys` of the rows whose config class reads use_sliding_window and max_window_layers.
READS_SLIDING_SWITCH = frozenset({USE_SLIDING_WINDOW})
#: `family_keys` of the rows whose MLP reads mlp_bias (llama's, and the families built on it).
READS_MLP_BIAS = frozenset({MLP_BIAS})


def drop_unread_keys(raw: dict[str, Any], read: frozenset[str]) -> None:
    """Clear `raw` (a config.json dict, changed in place) of the FAMILY_KEYS not in `read`, and
    fill in those in `read` that it lacks as their config classes do."""
    for key, drop in _DROPS.items():
        if key not in read:
            drop(raw)
        elif key in _READ_DEFAULTS and raw.get(key) is None:
            raw[key] = _READ_DEFAULTS[key]
