"""Qwen2-VL's vision, embedding and decoder graphs against transformers (fp32, 1e-4): Qwen2.5-VL's
tower without windows, with LayerNorms and an fc1 → quick_gelu → fc2 MLP; each of those
differences, built the Qwen2.5-VL way, is caught."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mobius_genai.build import build
from mobius_genai.components import mlp, qwen_vision
from mobius_genai.components.norms import LayerNorm
from mobius_genai.config.qwen_vision import Qwen2VisionConfig
from mobius_genai.ep import get_ep
from mobius_genai.errors import WeightsError
from tests._ort import assert_only_the_decoder_fuses_gqa, model_ops, package_sessions
from tests._qwen_vl import TEXT_HIDDEN, patches, tiny_qwen2_vl
from tests.models.test_qwen2_5_vl import (
    TOLERANCE,
    _image,
    _reference_features,
    _run,
    assert_graphs_match_transformers,
)

#: The functions the mutants wrap, as they are before a test replaces them.
_MAKE_NORM, _ACTIVATION = qwen_vision.make_norm, mlp.activation


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    model = tiny_qwen2_vl()
    folder = tmp_path_factory.mktemp("qwen2_vl")
    model.save_pretrained(folder)
    return model, folder


def _features_error(model, folder, size: tuple[int, int] = (40, 56)) -> tuple[np.ndarray, float]:
    """The vision graph's image features for a random image of `size`, and their largest
    difference from transformers'."""
    pixel_values, grid = patches(_image(*size))
    session = package_sessions(build(folder, "cpu", "fp32", progress=False))["vision"]
    features = _run(session, {"pixel_values": pixel_values, "image_grid_thw": grid})
    features = features["image_features"]
    reference = _reference_features(model, pixel_values, grid)
    assert features.shape == reference.shape == (int(grid.prod()) // 4, TEXT_HIDDEN)
    return features, float(np.abs(features - reference).max())


@pytest.mark.parametrize("size", [(40, 56), (32, 32), (16, 48)])
def test_vision_graph_matches_transformers(qwen2, size):
    """Every block attends within the whole image, patches stay in pixel_values' order."""
    _, error = _features_error(*qwen2, size)
    assert error <= TOLERANCE


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard"])
def test_graphs_match_transformers_over_prefill_and_decode(qwen2, ep):
    """Seed 0's first greedy token is the image token: a decode step embeds it as text."""
    tokens = assert_graphs_match_transformers(*qwen2, ep)
    assert tokens[0] == qwen2[0].config.image_token_id


def test_the_tower_has_no_window_order(qwen2):
    """Without windows the patches are never reordered: no TopK (the window sort) in the graph,
    and the blocks' norms are LayerNormalization, not RMSNormalization."""
    package = build(qwen2[1], "cpu", "fp32", load_weights=False, progress=False)
    ops = {op for _, op in model_ops(package["vision"])}
    assert "TopK" not in ops
    assert "LayerNormalization" in ops and "RMSNormalization" not in ops


@pytest.mark.parametrize("ep", ["cpu", "cuda", "onnx-standard"])
def test_graph_ops_per_ep(qwen2, ep):
    """The EP's default dtype (cuda's float16: quick_gelu's constant cast to it); the tower's
    attention is PackedMultiHeadAttention where the EP has the kernel (cuda), else its
    standard body; GroupQueryAttention in the decoder only."""
    package = build(qwen2[1], ep, load_weights=False, progress=False)
    assert_only_the_decoder_fuses_gqa(package, ep)
    packed = ("com.microsoft", "PackedMultiHeadAttention") in model_ops(package["vision"])
    assert packed is get_ep(ep).supports_packed_multi_head_attention


class _RmsWithBias(LayerNorm):
    """The mutant: RMS normalization (no mean taken off), then LayerNorm's weight and bias."""

    def forward(self, op, x):
        scaled = op.RMSNormalization(x, self.weight, axis=-1, epsilon=self.eps)
        return op.Add(scaled, self.bias)


def _rms_norms(kind, size, eps, **kwargs):
    return _RmsWithBias(size, eps) if kind == "layer" else _MAKE_NORM(kind, size, eps, **kwargs)


def _silu_for_quick_gelu(op, x, name):
    return _ACTIVATION(op, x, "silu" if name == "quick_gelu" else name)


@pytest.mark.parametrize(
    ("module", "name", "mutant"),
    [
        (qwen_vision, "make_norm", _rms_norms),  # RMSNorm instead of LayerNorm
        (mlp, "activation", _silu_for_quick_gelu),  # SwiGLU's silu instead of quick_gelu
    ],
)
def test_qwen2_5_vl_block_math_is_caught(qwen2, monkeypatch, module, name, mutant):
    monkeypatch.setattr(module, name, mutant)
    _, error = _features_error(*qwen2)
    assert error > 100 * TOLERANCE


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"gated_mlp": True}, "mlp.gate_proj.weight"),  # SwiGLU instead of fc1 → act → fc2
        ({"norm_type": "rms"}, "norm1.bias"),  # RMSNorm (no bias) instead of LayerNorm
    ],
)
def test_qwen2_5_vl_blocks_do_not_read_the_checkpoint(qwen2, monkeypatch, change, named):
    """Qwen2.5-VL's block over a Qwen2-VL checkpoint: the build refuses, naming a tensor."""
    parse = Qwen2VisionConfig.from_dict

    def mutant(cls, raw):
        return dataclasses.replace(parse(raw), **change)

    monkeypatch.setattr(Qwen2VisionConfig, "from_dict", classmethod(mutant))
    with pytest.raises(WeightsError, match=named.replace(".", r"\.")):
        build(qwen2[1], "cpu", "fp32", progress=False)


def test_the_smoke_test_twin_keeps_one_block_of_the_same_kind():
    """Every block is of one kind (frame-wide), so the twin's tower is its first block, still
    Qwen2-VL's (LayerNorms, fc1/fc2, no windows)."""
    config = Qwen2VisionConfig()
    assert config.layers_of_every_kind() == 1
    cut = config.first_layers(1)
    assert type(cut) is Qwen2VisionConfig
    assert (cut.depth, cut.window_size, cut.norm_type, cut.gated_mlp) == (1, None, "layer", False)
