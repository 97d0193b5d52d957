"""The config.json field readers: a checked value, the default for null, or a ConfigError that
names the key, the value and what is accepted."""

from __future__ import annotations

import math

import pytest

from mobius_genai import ConfigError
from mobius_genai.config import fields


@pytest.mark.parametrize(
    ("read", "value", "expected"),
    [
        (lambda v: fields.integer(v, "k"), 3, 3),
        (lambda v: fields.integer(v, "k", positive=False), 0, 0),
        (lambda v: fields.number(v, "k"), 2, 2.0),
        (lambda v: fields.number(v, "k", positive=True), 0.5, 0.5),
        (lambda v: fields.flag(v, "k", True), False, False),
        (lambda v: fields.mapping(v, "k"), {"a": 1}, {"a": 1}),
        (lambda v: fields.float_tuple(v, "k"), [1, 2.5], (1.0, 2.5)),
        (lambda v: fields.int_tuple(v, "k"), 7, (7,)),
        (lambda v: fields.int_tuple(v, "k"), [1, 2], (1, 2)),
        (fields.model_type, "llama", "llama"),
    ],
)
def test_readers_return_checked_values(read, value, expected):
    assert read(value) == expected


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        (lambda v: fields.integer(v, "k", 5), 5),
        (lambda v: fields.number(v, "k", 1.5), 1.5),
        (lambda v: fields.flag(v, "k", True), True),
        (lambda v: fields.mapping(v, "k"), {}),
        (lambda v: fields.float_tuple(v, "k"), None),
        (lambda v: fields.int_tuple(v, "k"), ()),
    ],
)
def test_null_gives_the_default(read, expected):
    assert read(None) == expected


@pytest.mark.parametrize(
    ("read", "value", "accepted"),
    [
        (lambda v: fields.integer(v, "num_layers"), 0, "a positive integer"),
        (lambda v: fields.integer(v, "num_layers", positive=False), -1, "a non-negative integer"),
        (lambda v: fields.integer(v, "num_layers"), True, "a positive integer"),
        (lambda v: fields.number(v, "num_layers"), math.inf, "a number"),
        (lambda v: fields.number(v, "num_layers", positive=True), 0.0, "a positive number"),
        (lambda v: fields.flag(v, "num_layers", False), "yes", "true or false"),
        (lambda v: fields.mapping(v, "num_layers"), [1], "an object"),
        (lambda v: fields.float_tuple(v, "num_layers"), ["a"], "a list of numbers"),
        (lambda v: fields.int_tuple(v, "num_layers"), [1.5], "an int or list of ints"),
    ],
)
def test_bad_values_name_the_key_the_value_and_what_is_accepted(read, value, accepted):
    with pytest.raises(ConfigError) as error:
        read(value)
    message = str(error.value)
    assert "'num_layers'" in message and repr(value) in message and accepted in message


def test_require_and_model_type_refuse_missing_values():
    assert fields.require({"hidden_size": 8}, "hidden_size") == 8
    with pytest.raises(ConfigError, match="'hidden_size' is required and missing"):
        fields.require({"hidden_size": None}, "hidden_size")
    with pytest.raises(ConfigError, match="'model_type' is required"):
        fields.model_type("")


def test_is_int_and_is_number_refuse_bools_and_non_finite_numbers():
    assert fields.is_int(3) and not fields.is_int(True) and not fields.is_int(3.0)
    assert fields.is_number(3) and fields.is_number(0.5)
    assert not fields.is_number(False) and not fields.is_number(math.nan)
