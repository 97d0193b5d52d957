"""Readers of config.json fields: a raw JSON value in, a checked Python value out.

Each reader takes the value and the key it was read from, gives a default for null where the
field is optional, and raises a ConfigError naming the key, the value and what is accepted.
config parsing and the family table read every field through them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mobius_genai.config.limits import SIZE_LIMITS, check_size
from mobius_genai.errors import ConfigError


def is_int(value: Any) -> bool:
    """Whether `value` is a JSON integer (bools are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether `value` is a finite JSON number (bools are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def model_type(value: Any) -> str:
    """config.json's model_type, which must be a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(
            "config.json: field 'model_type' is required and must be a non-empty string, "
            f"found {value!r}"
        )
    return value


def require(raw: Mapping[str, Any], key: str) -> int:
    """raw[key], a required positive integer."""
    if raw.get(key) is None:
        raise ConfigError(f"config.json: field {key!r} is required and missing")
    return integer(raw[key], key)


def integer(value: Any, key: str, default: Any = None, *, positive: bool = True) -> Any:
    """`value` of field `key` as a positive (or non-negative) int; null gives `default`."""
    if value is None:
        return default
    if not is_int(value) or value < (1 if positive else 0):
        accepted = "a positive integer" if positive else "a non-negative integer"
        raise ConfigError(f"config.json: field {key!r} must be {accepted}, found {value!r}")
    if key in SIZE_LIMITS:  # before anything is sized by it (per-layer lists, tables)
        check_size(key, value)
    return value


def number(value: Any, key: str, default: Any = None, *, positive: bool = False) -> Any:
    """`value` of field `key` as a finite (optionally positive) float; null gives `default`."""
    if value is None:
        return default
    if not is_number(value) or (positive and value <= 0):
        accepted = "a positive number" if positive else "a number"
        raise ConfigError(f"config.json: field {key!r} must be {accepted}, found {value!r}")
    return float(value)


def flag(value: Any, key: str, default: bool) -> bool:
    """`value` of field `key` as a bool; null gives `default`."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"config.json: field {key!r} must be true or false, found {value!r}")
    return value


def mapping(value: Any, key: str) -> dict[str, Any]:
    """`value` of field `key` as a dict; null gives {}."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"config.json: field {key!r} must be an object, found {value!r}")
    return dict(value)


def float_tuple(value: Any, key: str) -> tuple[float, ...] | None:
    """`value` of field `key` as a tuple of floats; null gives None."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(is_number(v) for v in value):
        raise ConfigError(f"config.json: field {key!r} must be a list of numbers, found {value!r}")
    return tuple(float(v) for v in value)


def int_tuple(value: Any, key: str) -> tuple[int, ...]:
    """`value` of field `key` (an int or a list of ints) as a tuple of ints; null gives ()."""
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if not all(is_int(v) for v in values):
        raise ConfigError(
            f"config.json: field {key!r} must be an int or list of ints, found {value!r}"
        )
    return tuple(values)
