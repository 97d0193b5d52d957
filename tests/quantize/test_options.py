"""Int4Options validation, EP defaults, and the block-size error for a model's weights."""

from __future__ import annotations

import collections
import dataclasses

import pytest

import mobius_genai
from mobius_genai.ep import get_ep
from mobius_genai.errors import ConfigError, MobiusError
from mobius_genai.quantize import (
    BLOCK_SIZES,
    DEFAULT_QUALITY,
    QUALITIES,
    Int4Options,
    quantize_int4,
)


@pytest.mark.parametrize("size", [0, 8, 48, 100, 512, -32, True, 32.0, "32"])
def test_block_size_outside_the_accepted_powers_of_two_is_refused(size):
    with pytest.raises(ConfigError) as error:
        Int4Options(block_size=size)
    message = str(error.value)
    assert repr(size) in message
    assert "16, 32, 64, 128, 256" in message


@pytest.mark.parametrize("size", BLOCK_SIZES)
def test_accepted_block_sizes(size):
    assert Int4Options(block_size=size).block_size == size


def test_unset_block_size_is_the_recipes_and_a_chosen_one_wins(monkeypatch):
    """A recipe's base block size applies unless the user picks one (--int4-block-size)."""
    wide = dataclasses.replace(QUALITIES["mixed"], block_size=64)
    monkeypatch.setitem(QUALITIES, "mixed", wide)
    caps = get_ep("cpu")
    assert Int4Options(quality="mixed").resolved(caps).block_size == 64
    assert Int4Options(quality="mixed", block_size=32).resolved(caps).block_size == 32
    assert Int4Options.from_choices(block_size=16, quality="mixed").block_size == 16
    assert DEFAULT_QUALITY != "mixed"
    assert Int4Options().resolved(caps).block_size == QUALITIES[DEFAULT_QUALITY].block_size == 32


@pytest.mark.parametrize("level", [-1, 5, True, 2.0, "4"])
def test_accuracy_level_outside_0_to_4_is_refused(level):
    with pytest.raises(ConfigError, match=r"accuracy level .* accepted: 0 .* 4"):
        Int4Options(accuracy_level=level)


def test_symmetric_must_be_a_bool():
    with pytest.raises(ConfigError, match="symmetric"):
        Int4Options(symmetric="no")


def test_errors_are_one_line_mobius_errors():
    with pytest.raises(MobiusError) as error:
        Int4Options(block_size=48)
    assert isinstance(error.value, ValueError) and "\n" not in str(error.value)


@pytest.mark.parametrize(("ep", "level"), [("cpu", 4), ("webgpu", 4), ("cuda", 0), ("dml", 0)])
def test_accuracy_level_defaults_to_the_ep_and_can_be_overridden(ep, level):
    caps = get_ep(ep)
    assert Int4Options().resolved(caps).accuracy_level == level
    assert Int4Options(accuracy_level=1).resolved(caps).accuracy_level == 1
    assert Int4Options(accuracy_level=0).resolved(caps).accuracy_level == 0


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard"])
def test_block_size_that_does_not_divide_a_weight_is_refused_before_any_change(ep, untied_ckpt):
    """intermediate_size 96: block 64 divides hidden (64) but not down_proj's K (96)."""
    caps = get_ep(ep)
    package = mobius_genai.build(untied_ckpt, caps, "f32")
    model = package["model"]
    before = collections.Counter(node.op_type for node in model.graph)
    initializers = set(model.graph.initializers)
    with pytest.raises(ConfigError) as error:
        quantize_int4(model, Int4Options(block_size=64), caps)
    message = str(error.value)
    assert "model.layers.0.mlp.down_proj.weight" in message
    assert "K=96" in message and "block size 64" in message
    assert "block sizes that divide every weight of this model: 16, 32" in message
    assert collections.Counter(node.op_type for node in model.graph) == before
    assert set(model.graph.initializers) == initializers


def test_block_size_larger_than_every_weight(untied_ckpt):
    caps = get_ep("cpu")
    package = mobius_genai.build(untied_ckpt, caps, "f32")
    with pytest.raises(ConfigError, match=r"K=64 .* divide every weight of this model: 16, 32"):
        quantize_int4(package["model"], Int4Options(block_size=256), caps)


def test_from_choices_is_none_without_a_choice_and_keeps_defaults_otherwise():
    assert Int4Options.from_choices() is None
    assert Int4Options.from_choices(asymmetric=True) == Int4Options(symmetric=False)
    assert Int4Options.from_choices(block_size=64) == Int4Options(block_size=64)
    assert Int4Options.from_choices(accuracy_level=0) == Int4Options(accuracy_level=0)
    with pytest.raises(ConfigError, match="int4 block size 48 is not accepted"):
        Int4Options.from_choices(block_size=48)
