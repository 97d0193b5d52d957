"""MiniMax (lightning attention, GQA, MoE and residual factors: config/lightning_attention.py,
config/residual_factors.py, components/lightning_attention.py, models/families/minimax.py): a
prefill and cached decode steps on the portable and cpu graphs against transformers; a
left-padded batch against each prompt alone; a graph built with a mechanism changed fails
(the decay, the residual factors, the state carried); onnxruntime-genai's tokens alone and for
a batch of prompts of different lengths (slow); int4 on cpu; the GPU EPs' graphs; layer
placement and refused configs.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import onnx
import pytest
from transformers import MiniMaxConfig
from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

import mobius_genai
from mobius_genai import ConfigError, UnsupportedModelError, packager
from mobius_genai.bundle.og_support import BEAM, ENGINE, NGRAM, REWIND, bundle_og_limits
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.components import lightning_attention
from mobius_genai.components.lightning_attention import LightningAttention
from mobius_genai.config.lightning_attention import read_lightning_attention, slope_rates
from mobius_genai.models import FAMILIES, get_family
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint
from tests._hf import hf_greedy_tokens, tiny_config, write_tiny_checkpoint
from tests._ort import built_graph_diff, max_abs_diff, ort_session, run_like_reference
from tests._recurrent import (
    alone_then_padded,
    assert_batch_continues_each_prompt,
    cached_reference,
    without_past,
)

TOLERANCE = 1e-4  # f32
FAMILY = "minimax"
LIGHTNING_LAYERS = (0, 2, 3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("minimax") / "ckpt", FAMILY)


@pytest.fixture(scope="module")
def run(checkpoint):
    """A 2 x 20-token prefill and 4 decode steps."""
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 20))
    return cached_reference(checkpoint, ids, 4)


@pytest.mark.parametrize(
    ("ep", "domains"),
    [
        ("default", {"", "com.microsoft"}),  # the scan as LinearAttention with its body
        ("cpu", {"", "com.microsoft"}),
        pytest.param("onnx-standard", {""}, marks=pytest.mark.slow),  # the bodies inlined
    ],
)
def test_prefill_then_decode_matches_transformers(checkpoint, run, ep, domains, tmp_path):
    built, diff = built_graph_diff(checkpoint, run, ep, tmp_path)
    assert built == domains
    assert diff <= TOLERANCE


def test_graph_declares_the_lightning_states_and_keeps_a_cache_for_attention(checkpoint):
    """Layers 0, 2 and 3 carry a float32 [4, 16, 16] state (and og's [1, 1] conv state);
    layer 1 attends over two key/value heads of 16 channels."""
    package = mobius_genai.build(checkpoint, "cpu", "f32", load_weights=False)
    inputs = {value.name: value for value in package["model"].graph.inputs}
    for layer in LIGHTNING_LAYERS:
        state = inputs[f"past_key_values.{layer}.recurrent_state"]
        assert list(state.shape)[1:] == [4, 16, 16]
        assert state.dtype == onnx.TensorProto.FLOAT
        assert list(inputs[f"past_key_values.{layer}.conv_state"].shape)[1:] == [1, 1]
        assert f"past_key_values.{layer}.key" not in inputs
    assert list(inputs["past_key_values.1.key"].shape)[1::2] == [2, 16]


def test_a_left_padded_batch_continues_each_prompt_alone(checkpoint, tmp_path):
    """Row 0 padded by 5 on the portable graph: the padding neither decays nor feeds the
    lightning state, and stays out of attention."""
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 128, size=7), rng.integers(3, 128, size=12)]
    reference = alone_then_padded(checkpoint, prompts, 3)
    package = mobius_genai.build(checkpoint, "default", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    ours[0][0, :5] = 0.0  # padded positions
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


def _row(**overrides) -> object:
    row = FAMILIES[FAMILY]
    return dataclasses.replace(row, config_overrides={**row.config_overrides, **overrides})


def _slopes_of_the_first_layer(raw):
    """Every layer decays as layer 0 does (the layer factor of the slopes dropped)."""
    sizes = read_lightning_attention(raw)
    return dataclasses.replace(sizes, slopes=(sizes.slopes[0],) * len(sizes.slopes))


#: mutant → the row with a mechanism changed (the layer factor: slow, the wrong decay below
#: runs by default)
ROW_MUTANTS = {
    "residual_factors_dropped": lambda: _row(residual_factors=None),
    "decay_without_the_layer_factor": lambda: _row(lightning_attention=_slopes_of_the_first_layer),
}


@pytest.mark.parametrize(
    "mutant",
    [
        pytest.param(m, marks=[pytest.mark.slow] if m == "decay_without_the_layer_factor" else [])
        for m in sorted(ROW_MUTANTS)
    ],
)
def test_a_row_mechanism_changed_fails_parity(checkpoint, run, mutant, monkeypatch, tmp_path):
    monkeypatch.setitem(FAMILIES, FAMILY, ROW_MUTANTS[mutant]())
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), run)
    assert not max_abs_diff(ours, run.logits) <= 10 * TOLERANCE


def _decay_doubled(op, slopes, real):
    return _decay(op, tuple(2 * slope for slope in slopes), real)


_decay = lightning_attention.decay


def test_a_wrong_decay_fails_parity(checkpoint, run, monkeypatch, tmp_path):
    monkeypatch.setattr(lightning_attention, "decay", _decay_doubled)
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), run)
    assert not max_abs_diff(ours, run.logits) <= 10 * TOLERANCE


def test_the_state_not_carried_fails_the_decode_steps(checkpoint, run, monkeypatch, tmp_path):
    monkeypatch.setattr(LightningAttention, "forward", without_past(LightningAttention, 1))
    package = mobius_genai.build(checkpoint, "cpu", "f32", progress=False)
    ours = run_like_reference(ort_session(package, tmp_path), run)
    assert max_abs_diff(ours[:1], run.logits[:1]) <= TOLERANCE  # the prefill starts from zeros
    assert not max_abs_diff(ours[1:], run.logits[1:]) <= 10 * TOLERANCE


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minimax_bundle")
    ckpt = bundle_checkpoint(folder / "ckpt", FAMILY)
    return ckpt, packager.package(ckpt, "cpu", folder / "bundle", quiet=True)


@pytest.mark.slow
def test_og_generates_transformers_tokens_alone_and_in_a_batch(bundle):
    """og's greedy tokens for one prompt, then for a batch of two prompts of different
    lengths (og pads the shorter on the right), are transformers' for each prompt alone."""
    ckpt, folder = bundle
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "decoder"
    validate_bundle(folder)
    # og's Engine, beams, n-gram decoding and rewind refuse its states as they refuse Mamba1's
    assert set(bundle_og_limits(folder)) == {ENGINE, BEAM, NGRAM, REWIND}
    tokens = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert tokens == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS, stop_at_eos=False)
    assert_batch_continues_each_prompt(ckpt, folder)


def test_int4_puts_the_projections_in_matmulnbits_and_the_experts_in_qmoe(tmp_path):
    """int4 for cpu: the attention's and the lightning layers' projections in MatMulNBits, the
    experts of every layer in QMoE; og generates every token asked for with it."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", FAMILY)
    bundle = packager.package(ckpt, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    tokens = greedy_tokens(load_model(bundle), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(tokens) == NEW_TOKENS
    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    assert ops["QMoE"] == 4
    assert ops["MatMulNBits"] >= 4 + 3 * 3  # attention 4, each lightning layer 3


@pytest.mark.parametrize(
    "ep", ["cuda", *(pytest.param(ep, marks=pytest.mark.slow) for ep in ("dml", "webgpu"))]
)
def test_gpu_ep_graphs_attend_with_group_query_attention(checkpoint, ep):
    """The full attention layer fuses to GroupQueryAttention; the three lightning layers keep
    a scan each (fused or as its body)."""
    graph = mobius_genai.build(checkpoint, ep, "f16", load_weights=False)["model"].graph
    ops = [node.op_type for node in graph]
    assert ops.count("GroupQueryAttention") == 1 and "Attention" not in ops
    assert (ops.count("LinearAttention") or ops.count("Scan")) == len(LIGHTNING_LAYERS)


def test_layers_and_slopes_are_transformers_own():
    theirs = MiniMaxConfig(num_hidden_layers=5, num_attention_heads=8, hidden_size=128)
    config = get_family(FAMILY).parse_config(theirs.to_dict())
    expected = tuple(
        "lightning_attention" if kind == "linear_attention" else kind for kind in theirs.layer_types
    )
    assert config.layer_types == expected
    for layer in range(5):
        module = MiniMaxLightningAttention(theirs, layer)
        rates = module.get_slope_rate().flatten().tolist()
        assert np.allclose(config.lightning_attention.slopes[layer], rates, rtol=1e-6)
    assert slope_rates(8, 5) == config.lightning_attention.slopes


def test_the_whole_head_turns_whatever_partial_rotary_factor_says():
    """MiniMaxRotaryEmbedding's default rope ignores partial_rotary_factor: every channel of
    each head turns."""
    rope = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    raw = {**json.loads(tiny_config(FAMILY).to_json_string()), "rope_parameters": rope}
    config = get_family(FAMILY).parse_config(raw)
    assert config.rotary_dim == config.head_dim == 16


def test_attn_type_list_places_the_layers():
    raw = {**json.loads(tiny_config(FAMILY).to_json_string()), "attn_type_list": [1, 0, 0, 1]}
    del raw["layer_types"]
    config = get_family(FAMILY).parse_config(raw)
    expected = ("full_attention", "lightning_attention", "lightning_attention", "full_attention")
    assert config.layer_types == expected


@pytest.mark.parametrize(
    ("changes", "error", "named"),
    [
        (
            {"layer_types": ["linear_attention", "mamba", "full_attention", "full_attention"]},
            ConfigError,
            "layer_types",
        ),
        ({"layer_types": None, "attn_type_list": [0, 1]}, ConfigError, "attn_type_list"),
        ({"sliding_window": 8}, UnsupportedModelError, "sliding_window"),
    ],
)
def test_refused_configs_name_the_field(changes, error, named):
    raw = {**json.loads(tiny_config(FAMILY).to_json_string()), **changes}
    with pytest.raises(error, match=named):
        get_family(FAMILY).parse_config(raw)
