"""ArchitectureConfig: both config.json layouts, and validation errors that name the field."""

from __future__ import annotations

import json

import pytest

from mobius_genai import ArchitectureConfig, ConfigError
from mobius_genai.models import get_family

BASE = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def test_hub_layout_rope_scaling_and_torch_dtype():
    raw = {
        **BASE,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "torch_dtype": "bfloat16",
    }
    config = ArchitectureConfig.from_dict(raw)
    assert config.rope.type == "llama3"
    assert config.rope.theta == 500000.0
    assert config.rope.factor == 8.0
    assert config.rope.original_max_position_embeddings == 8192
    assert config.torch_dtype == "bfloat16"
    assert config.head_dim == 16


def test_transformers5_layout_rope_parameters_and_dtype():
    raw = {
        **BASE,
        "rope_parameters": {"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0},
        "dtype": "float16",
    }
    config = ArchitectureConfig.from_dict(raw)
    assert (config.rope.type, config.rope.theta, config.rope.factor) == ("linear", 20000.0, 2.0)
    assert config.torch_dtype == "float16"


def test_explicit_head_dim_allows_hidden_not_divisible_by_heads():
    config = ArchitectureConfig.from_dict({**BASE, "hidden_size": 60, "head_dim": 32})
    assert config.head_dim == 32
    assert config.rotary_dim == 32


def test_mistral_sliding_window_applies_to_every_layer():
    config = ArchitectureConfig.from_dict({**BASE, "model_type": "mistral", "sliding_window": 5})
    assert config.layer_types == ("sliding_attention",) * 2
    assert config.window_of_layer(1) == 5


def test_qwen2_use_sliding_window_false_means_full_attention():
    raw = {**BASE, "model_type": "qwen2", "sliding_window": 32, "use_sliding_window": False}
    config = get_family("qwen2").parse_config(raw)
    assert config.layer_types == ("full_attention", "full_attention")
    assert config.sliding_window is None
    assert config.qkv_bias and not config.o_bias


def test_per_layer_layer_types():
    raw = {**BASE, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
    config = ArchitectureConfig.from_dict(raw)
    assert [config.window_of_layer(i) for i in range(2)] == [4, None]


def test_eos_list_and_partial_rotary():
    raw = {**BASE, "eos_token_id": [2, 7], "partial_rotary_factor": 0.5}
    config = ArchitectureConfig.from_dict(raw)
    assert config.eos_token_id == (2, 7)
    assert config.rotary_dim == 8


def test_from_file_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert ArchitectureConfig.from_file(tmp_path).num_hidden_layers == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"hidden_size": 62}, ["hidden_size 62", "num_attention_heads 4", "head_dim"]),
        ({"num_key_value_heads": 3}, ["num_key_value_heads 3", "divisor"]),
        ({"vocab_size": 0}, ["'vocab_size'", "positive integer", "0"]),
        ({"num_hidden_layers": -1}, ["'num_hidden_layers'", "-1"]),
        ({"intermediate_size": "big"}, ["'intermediate_size'", "'big'"]),
        ({"rope_scaling": {"type": "ntk-magic", "factor": 2.0}}, ["'ntk-magic'", "longrope"]),
        ({"hidden_act": "swish2"}, ["'swish2'", "silu"]),
        ({"layer_types": ["full_attention"]}, ["layer_types", "1 entries", "2 layers"]),
        ({"layer_types": ["full_attention", "chunked"]}, ["'chunked'", "sliding_attention"]),
        ({"layer_types": ["sliding_attention"] * 2}, ["sliding_window", "None"]),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}}, ["long_factor"]),
        ({"eos_token_id": "eos"}, ["'eos_token_id'", "'eos'"]),
    ],
)
def test_invalid_configs_name_field_value_and_accepted(change, words):
    with pytest.raises(ConfigError) as info:
        ArchitectureConfig.from_dict({**BASE, **change})
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "missing", ["hidden_size", "num_attention_heads", "vocab_size", "model_type"]
)
def test_missing_required_field(missing):
    raw = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ConfigError, match=f"'{missing}'"):
        ArchitectureConfig.from_dict(raw)


def test_missing_and_broken_config_json(tmp_path):
    with pytest.raises(ConfigError, match="config.json not found"):
        ArchitectureConfig.from_file(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not readable as JSON"):
        ArchitectureConfig.from_file(tmp_path)
