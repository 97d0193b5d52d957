"""Gemma 3n (gemma3n_text) beyond the family parity table: a prompt longer than the sliding
window on the portable, cpu and strict-ONNX graphs, a left-padded batch, the hub's config
layout; a mutant per mechanism (AltUp's correct step dropped, the sparsity cutoff off, a shared
layer reading the wrong layer's cache, Laurel without its residual, the per-layer inputs
in reverse layer order) fails parity;
the layers sharing a cache have no k/v weights and their Attention nodes read the source's
keys. (onnxruntime-genai's greedy tokens against transformers': test_bundles.py.)"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai import packager
from mobius_genai.components import altup, altup_layer
from mobius_genai.config.altup import altup_section
from mobius_genai.errors import ConfigError
from mobius_genai.models import FAMILIES
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, bundle_checkpoint
from tests._hf import (
    hf_greedy_tokens,
    hf_reference_logits,
    write_tiny_checkpoint,
)
from tests._ort import graph_diffs, left_padded_diffs, multimodal_text_decoder_diff
from tests.runtime._og import PROMPTS, engine_tokens

TOLERANCE = 1e-4  # f32, max abs diff of logits over the prefill and every decode step
PREFILL = 20  # four times the tiny model's sliding window (5)


@pytest.fixture(scope="module")
def gemma3n(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("gemma3n") / "ckpt", "gemma3n_text")


@pytest.fixture(scope="module")
def long_run(gemma3n):
    ids = np.random.default_rng(0).integers(3, 128, size=(2, PREFILL))
    return hf_reference_logits(gemma3n, ids, decode_steps=4)


def test_long_prompt_then_decode_matches_transformers_on_every_graph(gemma3n, long_run, tmp_path):
    eps = ("default", "cpu", "onnx-standard")
    diffs = graph_diffs(gemma3n, long_run, eps, tmp_path)
    assert max(diffs.values()) <= TOLERANCE, diffs
    standard = mobius_genai.build(gemma3n, "onnx-standard", "f32", load_weights=False)
    assert {node.domain for node in standard["model"].graph} == {""}


def test_left_padded_batch_matches_transformers(gemma3n, tmp_path):
    first, rest = left_padded_diffs(gemma3n, tmp_path)
    assert max(first, rest) <= TOLERANCE, (first, rest)


def test_hub_layout_config_matches_transformers(tmp_path):
    """rope_theta and rope_local_base_freq instead of rope_parameters, as hub configs have."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gemma3n_text", hub_layout=True)
    written = json.loads((ckpt / "config.json").read_text())
    assert "rope_parameters" not in written and written["rope_local_base_freq"] == 100.0
    ids = np.random.default_rng(1).integers(3, 128, size=(1, 14))
    reference = hf_reference_logits(ckpt, ids, decode_steps=2)
    diffs = graph_diffs(ckpt, reference, ("default",), tmp_path)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_hub_multimodal_checkpoint_builds_its_text_decoder(gemma3n, tmp_path):
    """A gemma3n checkpoint (Gemma3nForConditionalGeneration's layout) gives the text decoder
    transformers' Gemma3nForCausalLM runs, tower tensors unread; any other unread tensor is
    refused."""
    towers = ("model.vision_tower.stem.weight", "model.embed_vision.embedding.weight")
    diff = multimodal_text_decoder_diff(gemma3n, tmp_path, "gemma3n", towers)
    assert diff <= TOLERANCE


def _section(**changes):
    return lambda raw: dataclasses.replace(altup_section(raw), **changes)


def _row(**section_changes):
    row = FAMILIES["gemma3n_text"]
    overrides = {**row.config_overrides, "altup": _section(**section_changes)}
    return dataclasses.replace(row, config_overrides=overrides)


_CORRECT = altup.AltUp._correct


def _no_correct_step(self, op, predictions, output):
    """Only the active stream corrected (stream 0 here); the others keep their predictions."""
    corrected = _CORRECT(self, op, predictions, output)
    axis, one, end = (op.Constant(value_ints=[v]) for v in (2, 1, 2**62))
    first = op.Slice(corrected, op.Constant(value_ints=[0]), one, axis)
    return op.Concat(first, op.Slice(predictions, one, end, axis), axis=2)


def _laurel_without_residual(self, op, x):
    return self.post_laurel_norm(op, self.linear_right(op, self.linear_left(op, x)))


_PER_LAYER_INPUTS = mobius_genai.models.causal_lm.AltUpTextModel._per_layer_inputs


def _per_layer_inputs_reversed(self, op, input_ids, embeds):
    """Each layer given the last layer's slice, the second the one before it, ..."""
    inputs = _PER_LAYER_INPUTS(self, op, input_ids, embeds)
    starts, ends, axes, steps = ([v] for v in (-1, -(2**62), 2, -1))
    return op.Slice(inputs, *(op.Constant(value_ints=v) for v in (starts, ends, axes, steps)))


# mutant → (the row it builds with, or None, and the method it replaces: (owner, name, body))
MUTANTS = {
    "altup_correct_step_of_other_streams_dropped": (
        None,
        (altup.AltUp, "_correct", _no_correct_step),
    ),
    "sparsity_cutoff_off": (_row(activation_sparsity=(0.0,) * 6), None),
    "kv_shared_from_the_wrong_layer": (_row(kv_sources=(0, 1, 2, 3, 0, 1)), None),
    "laurel_without_its_residual": (
        None,
        (altup_layer.Laurel, "forward", _laurel_without_residual),
    ),
    "per_layer_inputs_in_reverse_layer_order": (
        None,
        (
            mobius_genai.models.causal_lm.AltUpTextModel,
            "_per_layer_inputs",
            _per_layer_inputs_reversed,
        ),
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mutant_fails_parity(mutant, gemma3n, long_run, tmp_path, monkeypatch):
    row, method = MUTANTS[mutant]
    if row is not None:
        monkeypatch.setitem(FAMILIES, "gemma3n_text", row)
    if method is not None:
        monkeypatch.setattr(*method)
    diffs = graph_diffs(gemma3n, long_run, ("default",), tmp_path)
    assert min(diffs.values()) > 10 * TOLERANCE, diffs


def test_shared_layers_attend_over_their_source_layers_keys(gemma3n):
    """Layers 4 and 5 (sliding, full) read layers 2 and 3's caches: no k/v weights of their
    own, and their Attention nodes take the source's new and past keys and values."""
    graph = mobius_genai.build(gemma3n, "default", "f32", load_weights=False)["model"].graph
    weights = set(graph.initializers)
    for layer in range(6):
        own = f"model.layers.{layer}.self_attn.k_proj.weight" in weights
        assert own == (layer < 4), layer
    attention = [node for node in graph if node.op_type == "Attention"]
    assert len(attention) == 6
    for reader, source in ((4, 2), (5, 3)):
        for key in (1, 2, 4, 5):  # new keys and values, past keys and values
            assert attention[reader].inputs[key] is attention[source].inputs[key]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_kv_shared_layers": 6}, "num_kv_shared_layers 6 leaves no layer to share from"),
        ({"altup_active_idx": 4}, "altup_active_idx 4 is not a stream of 4"),
        ({"activation_sparsity_pattern": [0.95, 1.0]}, "activation_sparsity_pattern has 2"),
        ({"intermediate_size": [96, 80]}, "intermediate_size has 2 values for 6 layers"),
    ],
)
def test_bad_config_is_one_clear_line(changes, message, tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gemma3n_text")
    raw = {**json.loads((ckpt / "config.json").read_text()), **changes}
    with pytest.raises(ConfigError, match=message):
        FAMILIES["gemma3n_text"].parse_config(raw)


def test_int4_bundle_keeps_altups_four_wide_coefficients_float_and_generates(tmp_path):
    """AltUp's coefficient projections read K=4 (its streams), below every int4 block: they stay
    float MatMuls while every other projection becomes MatMulNBits, both tables
    GatherBlockQuantized; og generates from it."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "gemma3n_text")
    options = Int4Options(block_size=16)  # the tiny MLP sizes (80) take 16
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=options, quiet=True
    )
    graph = ir.load(folder / "model.onnx").graph
    float_weights = {
        node.inputs[1].name
        for node in graph
        if node.op_type == "MatMul" and node.inputs[1].const_value is not None
    }
    coefs = {f"model.layers.{i}.altup.{name}" for i in range(6) for name in _COEFS}
    assert {name.removesuffix(".weight") for name in float_weights} == coefs
    # per layer: q (k packed beside it where the layer has its own), o, laurel (2), per-layer
    # gate and projection, the router twice (predict, correct), 3 MLP; v in the four layers
    # with a cache; the per-layer model projection, 6 stream projections, the head
    assert [node.op_type for node in graph].count("MatMulNBits") == 6 * 11 + 4 + 1 + 6 + 1
    # the token embedding, and the per-layer table read by the ids (those past it: row 0)
    tables = [node.inputs[0].name for node in graph if node.op_type == "GatherBlockQuantized"]
    assert tables == ["model.embed_tokens.weight_Q4", "model.embed_tokens_per_layer.weight_Q4"]
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8


_COEFS = ("prediction_coefs", "correction_coefs")


def test_og_engine_batches_prompts_of_different_lengths_like_transformers(tmp_path):
    """og.Engine places each row's keys in the caches (components/kv_slots.py); the layers
    sharing a cache read the placed keys of their source, so every row continues as
    transformers continues its prompt alone."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "gemma3n_text")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    rows, failures = engine_tokens(load_model(folder), PROMPTS, 8)
    assert failures == []
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in PROMPTS]
