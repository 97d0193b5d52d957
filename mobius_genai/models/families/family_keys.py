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
_ROPE_DICTS = ("rope_parameters", "rope_scaling")


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


#: Each gated key → how config.json is cleared of it.
_DROPS: dict[str, Callable[[dict[str, Any]], None]] = {PARTIAL_ROTARY: _drop_partial_rotary}
FAMILY_KEYS = frozenset(_DROPS)
#: `family_keys` of the rows whose rotary embedding reads partial_rotary_factor.
READS_PARTIAL_ROTARY = frozenset({PARTIAL_ROTARY})


def drop_unread_keys(raw: dict[str, Any], read: frozenset[str]) -> None:
    """Clear `raw` (a config.json dict, changed in place) of the FAMILY_KEYS not in `read`."""
    for key, drop in _DROPS.items():
        if key not in read:
            drop(raw)
