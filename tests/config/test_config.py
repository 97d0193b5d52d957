"""ArchitectureConfig: both config.json layouts, and validation errors that name the field."""

from __future__ import annotations

import json
import re

import pytest

from mobius_genai import ArchitectureConfig, ConfigError
from mobius_genai.models import get_family
from tests.conftest import TINY_QWEN2

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


def test_rotary_dim_truncates_like_transformers():
    config = ArchitectureConfig.from_dict({**BASE, "partial_rotary_factor": 0.3})  # 16 * 0.3
    assert config.rotary_dim == 4  # int(4.8), as transformers truncates


def test_gptj_rotary_dim_is_exact_where_the_quotient_is_not():
    from mobius_genai.models import FAMILIES

    raw = {"model_type": "gptj", "n_embd": 88, "n_head": 2, "n_layer": 1, "vocab_size": 32}
    raw["n_positions"] = 64
    config = FAMILIES["gptj"].parse_config({**raw, "rotary_dim": 30})  # head 44: 30/44*44 < 30
    assert config.rotary_dim == 30


def test_rope_interleaved_applies_to_every_rope():
    raw = {**BASE, "rope_local_base_freq": 100.0}
    assert not ArchitectureConfig.from_dict(raw).rope.interleaved
    config = ArchitectureConfig.from_dict(raw, rope_interleaved=True)
    assert config.rope.interleaved and config.rope_local.interleaved
    assert config.rope_local.theta == 100.0


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
        ({"hidden_act": "swish2"}, ["'swish2'", "silu", "relu2"]),
        ({"layer_types": ["full_attention"]}, ["layer_types", "1 entries", "2 layers"]),
        ({"layer_types": ["full_attention", "chunked"]}, ["'chunked'", "sliding_attention"]),
        ({"layer_types": ["sliding_attention"] * 2}, ["sliding_window", "None"]),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}}, ["long_factor"]),
        ({"rope_scaling": {"frequency_factors": [1.0, 2.0]}}, ["frequency_factors", "2 entries"]),
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


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"rope_scaling": "yarn"}, ["'rope_scaling'", "an object", "'yarn'"]),
        ({"rope_parameters": {"full_attention": 8}}, ["'rope_parameters.full_attention'", "8"]),
        ({"rope_theta": "abc"}, ["'rope_theta'", "positive number", "'abc'"]),
        ({"rope_theta": 0}, ["'rope_theta'", "positive number", "0"]),
        ({"rms_norm_eps": "x"}, ["'rms_norm_eps'", "positive number", "'x'"]),
        ({"rms_norm_eps": None, "layer_norm_eps": [1]}, ["'layer_norm_eps'", "[1]"]),
        ({"partial_rotary_factor": "half"}, ["'partial_rotary_factor'", "number", "'half'"]),
        ({"rope_local_base_freq": "10k"}, ["'rope_local_base_freq'", "'10k'"]),
        ({"rope_scaling": {"type": "linear", "factor": "2"}}, ["'rope_scaling.factor'", "'2'"]),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_fast": "x"}},
            ["'rope_parameters.beta_fast'", "number", "'x'"],
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "mscale": [1]}},
            ["'rope_scaling.mscale'", "[1]"],
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": "no"}},
            ["'rope_scaling.truncate'", "true or false", "'no'"],
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": "32"}},
            ["'rope_scaling.original_max_position_embeddings'", "positive integer", "'32'"],
        ),
        (
            {"rope_scaling": {"rope_type": "yarn"}, "original_max_position_embeddings": 0},
            ["'original_max_position_embeddings'", "positive integer", "0"],
        ),
        (
            {"rope_scaling": {"rope_type": "longrope", "short_factor": 3, "long_factor": [1]}},
            ["'rope_scaling.short_factor'", "list of numbers", "3"],
        ),
        (
            {"rope_scaling": {"rope_type": "longrope", "short_factor": ["a"], "long_factor": []}},
            ["'rope_scaling.short_factor'", "list of numbers", "['a']"],
        ),
        ({"tie_word_embeddings": "yes"}, ["'tie_word_embeddings'", "true or false", "'yes'"]),
        ({"attention_bias": "false"}, ["'attention_bias'", "true or false", "'false'"]),
        ({"use_sliding_window": "no"}, ["'use_sliding_window'", "true or false", "'no'"]),
        (
            {"use_sliding_window": True, "max_window_layers": "1"},
            ["'max_window_layers'", "non-negative integer", "'1'"],
        ),
        ({"use_sliding_window": True, "layer_types": "full_attention"}, ["'layer_types'", "list"]),
        (
            {"use_sliding_window": True, "layer_types": [{}, "full_attention"]},
            ["layer_types", "{}", "sliding_attention"],
        ),
        (
            {"use_sliding_window": True, "sliding_window": True},
            ["sliding_window", "positive integer", "True"],
        ),
        ({"head_dim": "16"}, ["'head_dim'", "positive integer", "'16'"]),
    ],
)
def test_wrong_types_are_config_errors(change, words):
    raw = {**json.loads((TINY_QWEN2 / "config.json").read_text()), **change}
    with pytest.raises(ConfigError) as info:
        ArchitectureConfig.from_dict(raw)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("value", [None, "", 3])
def test_model_type_must_be_a_non_empty_string(value):
    message = f"'model_type' is required and must be a non-empty string, found {value!r}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        ArchitectureConfig.from_dict({**BASE, "model_type": value})
    with pytest.raises(ConfigError, match=re.escape(message)):
        get_family(value)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_key_value_heads": 0}, ["'num_key_value_heads'", "positive integer", "0"]),
        ({"head_dim": 0}, ["'head_dim'", "positive integer", "0"]),
        ({"hidden_size": -1}, ["'hidden_size'", "positive integer", "-1"]),
        ({"num_attention_heads": 0}, ["'num_attention_heads'", "positive integer", "0"]),
    ],
)
def test_zero_or_negative_sizes_are_not_treated_as_absent(change, words):
    with pytest.raises(ConfigError) as info:
        ArchitectureConfig.from_dict({**BASE, **change})
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("scaling", "field"),
    [
        ({"rope_type": "linear"}, "rope_scaling.factor"),
        ({"type": "dynamic", "factor": None}, "rope_scaling.factor"),
        (
            {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0},
            "rope_scaling.low_freq_factor",
        ),
        (
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0},
            "rope_scaling.high_freq_factor",
        ),
    ],
)
def test_rope_scaling_without_required_key(scaling, field):
    message = f"field '{field}' is required for '{scaling.get('rope_type', scaling.get('type'))}'"
    with pytest.raises(ConfigError, match=re.escape(message)):
        ArchitectureConfig.from_dict({**BASE, "rope_scaling": scaling})


def test_yarn_without_factor_derives_it_as_transformers_does():
    raw = {**BASE, "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 16}}
    assert ArchitectureConfig.from_dict(raw).rope.factor == 4.0


@pytest.mark.parametrize(
    ("model_type", "change", "words"),
    [
        ("granite", {"attention_multiplier": "x"}, ["'attention_multiplier'", "'x'"]),
        ("granite", {"logits_scaling": 0}, ["'logits_scaling'", "positive number", "0"]),
        ("gemma2", {"query_pre_attn_scalar": "x"}, ["'query_pre_attn_scalar'", "'x'"]),
        ("gemma2", {"num_hidden_layers": None}, ["'num_hidden_layers'", "missing"]),
        ("gemma", {"hidden_size": -4}, ["'hidden_size'", "positive integer", "-4"]),
        ("gemma3_text", {"sliding_window_pattern": "6"}, ["'sliding_window_pattern'", "'6'"]),
        ("phi", {"qk_layernorm": "x"}, ["'qk_layernorm'", "true or false"]),
        ("gpt2", {"scale_attn_weights": 1.5}, ["'scale_attn_weights'", "true or false"]),
        ("smollm3", {"no_rope_layer_interval": 0}, ["'no_rope_layer_interval'", "0"]),
        ("smollm3", {"no_rope_layers": 3}, ["'no_rope_layers'", "per layer (2)", "3"]),
        ("starcoder2", {"use_bias": 1.5}, ["'use_bias'", "true or false", "1.5"]),
        ("starcoder2", {"norm_epsilon": -1}, ["'norm_epsilon'", "positive number", "-1"]),
        ("stablelm", {"use_parallel_residual": "x"}, ["'use_parallel_residual'", "'x'"]),
        ("stablelm", {"qk_layernorm": 1}, ["'qk_layernorm'", "true or false"]),
        ("stablelm", {"num_attention_heads": 5}, ["hidden_size 64", "num_attention_heads 5"]),
        ("olmo", {"clip_qkv": "8"}, ["'clip_qkv'", "positive number", "'8'"]),
        ("gpt_neox", {"use_parallel_residual": 1}, ["'use_parallel_residual'", "true or false"]),
        ("gpt_neox", {"head_dim": 8}, ["gpt_neox needs", "hidden_size", "head_dim 8"]),
        ("gpt_neox", {"rotary_pct": 0.0}, ["partial_rotary_factor 0.0", "(0, 1]"]),
        ("gpt_neox", {"attention_bias": "yes"}, ["'attention_bias'", "'yes'"]),
        ("nemotron", {"norm_eps": 0}, ["'norm_eps'", "positive number", "0"]),
        ("nemotron", {"hidden_act": "relu3"}, ["'relu3'", "relu2"]),
        ("exaone", {"activation_function": "swish"}, ["'swish'", "silu"]),
        ("exaone", {"layer_norm_epsilon": "x"}, ["'layer_norm_epsilon'", "'x'"]),
        ("gptj", {"rotary_dim": 32}, ["'rotary_dim'", "head size 16", "32"]),
        ("gptj", {"rotary_dim": 4.0}, ["'rotary_dim'", "positive integer", "4.0"]),
        # GPTNeoXRotaryEmbedding sizes itself from head_dim (GPTJ's never reads it)
        ("gpt_neox", {"head_dim": 8}, ["gpt_neox needs", "hidden_size", "head_dim 8"]),
        ("gptj", {"hidden_size": 66}, ["gptj needs", "hidden_size 66", "num_attention_heads 4"]),
        ("cohere", {"logit_scale": 0}, ["'logit_scale'", "positive number", "0"]),
        ("cohere", {"use_qk_norm": "yes"}, ["'use_qk_norm'", "true or false", "'yes'"]),
        ("glm", {"partial_rotary_factor": 1.5}, ["partial_rotary_factor 1.5", "(0, 1]"]),
        ("glm", {"attention_bias": 1}, ["'attention_bias'", "true or false"]),
        ("cohere2", {"logit_scale": -2}, ["'logit_scale'", "positive number", "-2"]),
        ("cohere2", {"sliding_window_pattern": 0}, ["'sliding_window_pattern'", "0"]),
        ("cohere2", {"layer_types": "sliding"}, ["'layer_types'", "must be a list"]),
        ("cohere2", {"sliding_window": 0}, ["sliding_window must be a positive integer", "0"]),
        ("glm4", {"partial_rotary_factor": 1.5}, ["partial_rotary_factor 1.5", "(0, 1]"]),
    ],
)
def test_family_fields_with_wrong_values(model_type, change, words):
    raw = {**BASE, "model_type": model_type, **change}
    with pytest.raises(ConfigError) as info:
        get_family(model_type).parse_config(raw)
    for word in words:
        assert word in str(info.value)


def test_missing_and_broken_config_json(tmp_path):
    with pytest.raises(ConfigError, match="config.json not found"):
        ArchitectureConfig.from_file(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not readable as JSON"):
        ArchitectureConfig.from_file(tmp_path)
