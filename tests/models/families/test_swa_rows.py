"""granite_swa and granitemoe_swa: what their rows read from config.json as GraniteSWAConfig
and GraniteMoeSWAConfig read it, one rope table per rope base in the cpu graph, and the twin
keeping a layer of every base.

Logits against transformers, and the mutants (one rope base for every layer, no window, no
sinks), are test_parity.py's CASES and MUTANTS; the bundles' greedy tokens test_bundles.py's.
"""

from __future__ import annotations

import pytest
from transformers import GraniteMoeSWAConfig, GraniteSWAConfig

import mobius_genai
from mobius_genai import ConfigError
from mobius_genai.models import get_family
from tests._hf import tiny_config, write_tiny_checkpoint

#: The keys each config class fills in when config.json leaves them out.
_FILLED = (
    "layer_types",
    "sliding_window",
    "layer_rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
)


@pytest.mark.parametrize(
    ("family", "config_class"),
    [("granite_swa", GraniteSWAConfig), ("granitemoe_swa", GraniteMoeSWAConfig)],
)
def test_defaults_as_the_config_class_fills_them(family, config_class):
    """Every fourth layer from the first full, a window of 128, every layer on rope_theta."""
    raw = tiny_config(family, num_hidden_layers=6).to_dict()
    for key in (*_FILLED, "num_key_value_heads"):
        raw.pop(key)
    theirs = config_class(**raw)
    config = get_family(family).parse_config(raw)
    assert config.layer_types == tuple(theirs.layer_types)
    assert config.layer_types[0] == config.layer_types[4] == "full_attention"
    assert config.sliding_window == theirs.sliding_window == 128
    assert config.norm_eps == theirs.rms_norm_eps
    assert config.tie_word_embeddings == theirs.tie_word_embeddings
    assert config.num_key_value_heads == theirs.num_key_value_heads
    ropes = {config.rope_of_layer(i) for i in range(6)}
    assert ropes == {config.rope} and config.rope.theta == theirs.layer_rope_theta[0]
    assert config.attention_sinks


def test_each_layer_rotates_with_its_own_base():
    config = get_family("granite_swa").parse_config(tiny_config("granite_swa").to_dict())
    thetas = [None if rope is None else rope.theta for rope in map(config.rope_of_layer, range(3))]
    assert thetas == [10000.0, None, 100.0]
    assert config.layers_of_every_kind() == 3
    twin = config.first_layers(2)
    assert twin.layer_rope_thetas == (10000.0, 0)


@pytest.mark.parametrize(
    "thetas",
    [[10000.0, 100.0], [10000.0, -1.0, 100.0], [10000.0, "x", 100.0], 10000.0],
)
def test_a_rope_base_list_that_does_not_fit_is_refused_in_one_line(thetas):
    raw = {**tiny_config("granite_swa").to_dict(), "layer_rope_theta": thetas}
    with pytest.raises(ConfigError, match="layer_rope_theta must|field 'layer_rope_theta'"):
        get_family("granite_swa").parse_config(raw)


def test_cpu_graph_has_one_rope_table_per_base_and_windows_with_sinks(tmp_path):
    """GroupQueryAttention in each layer: the first layer's rope table, none in the second
    (no rotary), the third's own table; windows in the sliding layers; the sinks as head_sink."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "granite_swa")
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    nodes = [node for node in graph if node.op_type == "GroupQueryAttention"]
    windows = [node.attributes.get_int("local_window_size", -1) for node in nodes]
    assert windows == [-1, 5, 5]
    rotary = [node.attributes.get_int("do_rotary", 0) for node in nodes]
    assert rotary == [1, 0, 1]
    caches = [nodes[i].inputs[7].name for i in (0, 2)]
    assert caches == ["model.rotary_emb.cos_cache", "model.rotary_emb_layers.0.cos_cache"]
    assert all(node.inputs[11] is not None for node in nodes)  # head_sink


def test_cuda_float16_graph_fuses_the_widened_sinks_of_every_layer(tmp_path):
    """float16 sinks are widened to float32 (components/sinks.py); the layer without rotary
    fuses as the rotating ones do (GroupQueryAttention, do_rotary=0, head_sink)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "granite_swa")
    graph = mobius_genai.build(ckpt, "cuda", "f16", load_weights=False)["model"].graph
    nodes = [node for node in graph if "Attention" in node.op_type]
    assert [node.op_type for node in nodes] == ["GroupQueryAttention"] * 3
    assert [node.attributes.get_int("do_rotary", 0) for node in nodes] == [1, 0, 1]
    assert all(node.inputs[11] is not None for node in nodes)
