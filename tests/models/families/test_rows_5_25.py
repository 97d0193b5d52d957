"""gpt_bigcode, falcon, minicpm3 and cwm: what their rows read from config.json as their
transformers config classes read it, the layouts they refuse in one line, and MiniCPM3's
longrope past its original length.

Logits of each layout against transformers, and the mutants, are test_parity.py's CASES and
MUTANTS; the bundles' greedy tokens are test_bundles.py's (slow).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from transformers import CwmConfig, FalconConfig, GPTBigCodeConfig, MiniCPM3Config

import mobius_genai
from mobius_genai import UnsupportedModelError
from mobius_genai.models import get_family
from tests._hf import hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._ort import graph_diffs

TOLERANCE = 1e-4  # f32, max abs diff of logits over the prefill and every decode step


def _parse(family: str, raw: dict):
    return get_family(family).parse_config(raw)


@pytest.mark.parametrize(
    ("switches", "kv_heads"),
    [
        ({}, 1),  # multi_query (the default): one head
        ({"multi_query": False}, 4),
    ],
)
def test_gpt_bigcode_key_value_heads(switches, kv_heads):
    raw = tiny_config("gpt_bigcode", **switches).to_dict()
    raw.pop("num_key_value_heads")  # hub configs have none; GPTBigCodeConfig derives it
    config = _parse("gpt_bigcode", raw)
    assert config.num_key_value_heads == kv_heads == GPTBigCodeConfig(**raw).num_key_value_heads
    assert config.packed_qkv and config.position_embedding == "learned"


@pytest.mark.parametrize(
    "switches",
    [
        {},  # Falcon-40B: new architecture, 2 groups
        {"new_decoder_architecture": False},  # Falcon-7B: multi-query
        {"new_decoder_architecture": False, "multi_query": False, "num_kv_heads": None},
    ],
)
def test_falcon_key_value_heads_and_sizes(switches):
    raw = tiny_config("falcon", **switches).to_dict()
    for key in ("num_key_value_heads", "ffn_hidden_size", "num_ln_in_parallel_attn"):
        raw.pop(key)
    theirs = FalconConfig(**raw)
    config = _parse("falcon", raw)
    assert config.num_key_value_heads == theirs.num_key_value_heads
    assert config.head_dim == theirs.head_dim and config.intermediate_size == 4 * 64
    assert config.parallel_residual and config.parallel_mlp_norm == (not switches)


@pytest.mark.parametrize(
    ("family", "switches", "message"),
    [
        (
            "falcon",
            {"parallel_attn": False},
            "parallel_attn is false with new_decoder_architecture",
        ),
        (
            "falcon",
            {"new_decoder_architecture": False, "multi_query": False},
            "num_kv_heads is 2 with multi_query and new_decoder_architecture off",
        ),
        (
            "gpt_bigcode",
            {"add_cross_attention": True, "multi_query": False},
            "add_cross_attention is True; gpt_bigcode models are supported only without",
        ),
    ],
)
def test_layouts_without_a_component_are_refused_in_one_line(family, switches, message, tmp_path):
    raw = tiny_config(family, **switches).to_dict()
    with pytest.raises(UnsupportedModelError, match=message):
        _parse(family, raw)


def test_minicpm3_scales_and_defaults_as_minicpm3config_reads_them():
    """scale_emb, scale_depth / sqrt(layers), hidden_size / dim_model_base; the class's
    defaults for absent keys, and its null scale_depth and dim_model_base (no scaling)."""
    config = _parse("minicpm3", tiny_config("minicpm3").to_dict())
    assert config.embedding_multiplier == 3.0
    assert config.residual_multiplier == pytest.approx(1.4 / math.sqrt(3))
    assert config.logits_scaling == 4.0 and not config.rope.interleaved
    raw = tiny_config("minicpm3").to_dict()
    for key in ("scale_emb", "scale_depth", "dim_model_base", "v_head_dim", "kv_lora_rank"):
        del raw[key]
    theirs = MiniCPM3Config(**raw)
    hub = _parse("minicpm3", raw)
    assert hub.embedding_multiplier == theirs.scale_emb == 12
    assert hub.residual_multiplier == theirs.scale_depth / math.sqrt(3)
    assert hub.logits_scaling == theirs.logits_scaling == 64 / 256
    assert hub.latent_attention.v_head_dim == theirs.v_head_dim == 16
    assert hub.latent_attention.kv_lora_rank == theirs.kv_lora_rank == 256
    nulls = {**raw, "scale_depth": None, "dim_model_base": None}
    unscaled = _parse("minicpm3", nulls)
    assert unscaled.residual_multiplier == pytest.approx(1.0) and unscaled.logits_scaling == 1.0


def test_minicpm3_longrope_past_its_original_length(tmp_path):
    """A 14-token prompt and 6 steps cross the original 16 positions: short factors, then
    long ones, the rope slice of each head rotated by halves."""
    longrope = {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.1, 1.3, 1.6],
        "long_factor": [1.0, 1.5, 2.2, 3.0],
        "original_max_position_embeddings": 16,
    }
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "minicpm3", seed=2, rope_scaling=longrope)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 14))
    reference = hf_reference_logits(ckpt, ids, decode_steps=6)
    diffs = graph_diffs(ckpt, reference, ("default", "cpu"), tmp_path, progress=False)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_cwm_defaults_as_cwmconfig_fills_them():
    """Every fourth layer from the first full, a window of 8192, llama3 rope (theta 1e6), three
    eos ids, 8 key/value heads of 128 when config.json names none."""
    raw = {
        key: value
        for key, value in tiny_config("cwm", num_hidden_layers=6, num_attention_heads=16)
        .to_dict()
        .items()
        if key
        not in ("layer_types", "sliding_window", "rope_parameters", "eos_token_id", "head_dim")
        and key != "num_key_value_heads"
    }
    theirs = CwmConfig(**raw)
    config = _parse("cwm", raw)
    assert config.layer_types == tuple(theirs.layer_types)
    assert config.layer_types[0] == config.layer_types[4] == "full_attention"
    assert config.sliding_window == theirs.sliding_window == 8192
    assert config.rope.type == "llama3" and config.rope.theta == 1e6
    assert config.eos_token_id == tuple(theirs.eos_token_id)
    assert (config.num_key_value_heads, config.head_dim) == (8, 128)
    assert not (config.qkv_bias or config.o_bias)


@pytest.mark.parametrize(
    ("family", "expected"),
    [("cwm", [-1, 5, 5]), ("gpt_neo", [5, -1, 5])],  # gpt_neo: local, global, local
)
def test_cpu_graph_windows_the_sliding_layers_only(family, expected, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    windows = [
        node.attributes.get_int("local_window_size", -1)
        for node in graph
        if node.op_type == "GroupQueryAttention"
    ]
    assert windows == expected
