"""Kinds of layers and a model cut to its first layers (the smoke test's small twin)."""

from __future__ import annotations

import pytest

from mobius_genai import ArchitectureConfig, ConfigError, build
from mobius_genai.models import get_family
from tests._hf import tiny_config
from tests.conftest import TINY_QWEN2

S, F = "sliding_attention", "full_attention"


def _config(family: str, **overrides: object) -> ArchitectureConfig:
    return get_family(family).parse_config(tiny_config(family, **overrides).to_dict())


@pytest.mark.parametrize(
    ("family", "overrides", "expected"),
    [
        ("qwen2", {"num_hidden_layers": 28}, 1),  # one kind: the first layer shows it
        ("gemma2", {"num_hidden_layers": 8}, 2),  # sliding, full, sliding, ...
        ("gemma3_text", {"num_hidden_layers": 12, "sliding_window_pattern": 6}, 6),  # 5:1
        ("olmo3", {"num_hidden_layers": 3, "layer_types": [S, S, F]}, 3),
        ("smollm3", {"num_hidden_layers": 8, "no_rope_layers": [1, 1, 1, 0] * 2}, 4),  # NoPE
        ("exaone4", {"num_hidden_layers": 8, "sliding_window_pattern": 4}, 4),  # global NoPE
    ],
)
def test_the_fewest_first_layers_that_hold_every_kind(family, overrides, expected):
    config = _config(family, **overrides)
    count = config.layers_of_every_kind()
    assert count == expected
    kinds = {config.layer_kind(i) for i in range(config.num_hidden_layers)}
    cut = config.first_layers(count)
    assert {cut.layer_kind(i) for i in range(count)} == kinds
    assert cut.num_hidden_layers == count and len(cut.layer_types) == count


def test_first_layers_keeps_everything_else():
    config = _config("smollm3", num_hidden_layers=8, no_rope_layers=[1, 1, 1, 0] * 2)
    cut = config.first_layers(5)
    assert cut.no_rope_layers == (3,) and config.no_rope_layers == (3, 7)
    assert cut.layer_types == config.layer_types[:5]
    assert {**vars(cut), "num_hidden_layers": 8, "layer_types": (), "no_rope_layers": ()} == {
        **vars(config),
        "layer_types": (),
        "no_rope_layers": (),
    }


@pytest.mark.parametrize("count", [0, 4, True, 1.0])
def test_first_layers_refuses_counts_outside_the_model(count):
    with pytest.raises(ConfigError, match="layer count"):
        _config("qwen2").first_layers(count)


def test_build_takes_the_first_layers_of_a_checkpoint():
    whole = build(TINY_QWEN2, "cpu", "f32", load_weights=False)
    cut = build(TINY_QWEN2, "cpu", "f32", load_weights=False, num_layers=1)
    assert (whole.config.num_hidden_layers, cut.config.num_hidden_layers) == (2, 1)
    inputs = [value.name for value in cut["model"].graph.inputs]
    assert "past_key_values.0.key" in inputs and "past_key_values.1.key" not in inputs
