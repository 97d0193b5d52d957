"""Doge beyond the parity table (test_parity.py's CASES and MUTANTS: the residual scales): the
dynamic mask against transformers, its keys kept past a window of 6 and mutants without the
dt bias or without the window, a left-padded batch, the GPU EPs' graphs, the cpu int4 bundle,
og's tokens alone and in a batch (slow), the layouts it refuses."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import mobius_genai
from mobius_genai import UnsupportedModelError
from mobius_genai.components.dynamic_mask import DynamicMaskAttention
from mobius_genai.models import FAMILIES
from tests._bundles import (
    bundle_checkpoint,
    check_bundle_generates_like_transformers,
    int4_bundle_ops,
)
from tests._hf import hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._ort import graph_diffs, left_padded_diffs

TOLERANCE = 1e-4  # f32, max abs diff of logits
ROW = FAMILIES["doge"]
#: A window of 6 keys that the 12-token prompts and their decode steps run past; seed 2's
#: greedy steps repeat no token whose first-layer bias would tie at a row's 6th largest
#: (torch.topk keeps some of tied keys, we keep them all: components/dynamic_mask.py).
WINDOW = {"keep_window_size": 6}
SEED = 2


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("doge") / "ckpt"
    return write_tiny_checkpoint(folder, "doge", seed=SEED, **WINDOW)


@pytest.fixture(scope="module")
def reference(windowed):
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    return hf_reference_logits(windowed, ids, decode_steps=4)


def test_keys_kept_past_the_window_match_transformers(windowed, reference, tmp_path):
    diffs = graph_diffs(windowed, reference, ("default", "cpu"), tmp_path)
    assert max(diffs.values()) <= TOLERANCE, diffs


_KEY_BIAS = DynamicMaskAttention._key_bias


def _no_key_bias(self, op, past_value, v):
    """dt computed (its tensors read) but not added: a plain causal mask."""
    return op.Mul(_KEY_BIAS(self, op, past_value, v), op.Constant(value_float=0.0))


def _no_window(self, op, bias):
    return bias


MUTANTS = {"without_key_bias": ("_key_bias", _no_key_bias), "without_window": ("_kept", _no_window)}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_parity_fails_with_the_dynamic_mask_broken(
    mutant, windowed, reference, tmp_path, monkeypatch
):
    name, broken = MUTANTS[mutant]
    monkeypatch.setattr(DynamicMaskAttention, name, broken)
    diffs = graph_diffs(windowed, reference, ("default",), tmp_path)
    assert diffs["default"] > 10 * TOLERANCE, diffs


def test_left_padded_batch_matches_transformers(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "doge", seed=SEED)
    first, rest = left_padded_diffs(ckpt, tmp_path / "onnx")
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


@pytest.mark.parametrize(
    "ep", ["cuda", *(pytest.param(e, marks=pytest.mark.slow) for e in ("dml", "webgpu"))]
)
def test_gpu_ep_graphs_attend_with_the_biased_mask(ep, windowed):
    """Each layer's keys biased by its values stay one standard Attention node (the causal
    GroupQueryAttention declines the biased mask), its window one TopK (float16)."""
    graph = mobius_genai.build(windowed, ep, "f16", load_weights=False)["model"].graph
    ops = Counter(node.op_type for node in graph)
    assert (ops["Attention"], ops["GroupQueryAttention"], ops["TopK"]) == (3, 0, 3), ops
    assert ops["Softplus"] == 3, ops


@pytest.mark.slow  # doge's projections are plain Linear layers (jetmoe's int4 test runs by default)
def test_cpu_int4_bundle_generates(tmp_path):
    """int4 for cpu: q/k/v/o, dt_proj, the MLPs and the LM head in MatMulNBits; og generates
    every token asked for."""
    ops = int4_bundle_ops("doge", tmp_path)
    assert ops["MatMulNBits"] == 3 * 8 + 1, ops


@pytest.mark.slow
def test_bundle_generates_like_transformers_alone_and_in_a_batch(tmp_path, capsys):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "doge")
    check_bundle_generates_like_transformers(ckpt, tmp_path, capsys)


@pytest.mark.parametrize(
    ("switch", "named"),
    [({"is_moe": True}, "is_moe is True"), ({"sliding_window": 16}, "sliding_window is 16")],
)
def test_layouts_not_built_are_refused_in_one_line(switch, named):
    raw = {**json.loads(json.dumps(tiny_config("doge").to_dict())), **switch}
    with pytest.raises(UnsupportedModelError, match=named) as error:
        ROW.parse_config(raw)
    assert "\n" not in str(error.value)


def test_a_window_longer_than_max_positions_still_cuts_a_longer_context(tmp_path):
    """A bundle's context may pass max_position_embeddings (--context-length): the window's
    top-k is in the graph whatever the checkpoint's length says."""
    config = ROW.parse_config(json.loads(json.dumps(tiny_config("doge").to_dict())))
    assert config.dynamic_mask.keep_window_size == 2048 > config.max_position_embeddings
    assert DynamicMaskAttention(config, 0).keep_window == 2048
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "doge")
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    assert [node.op_type for node in graph].count("TopK") == config.num_hidden_layers
