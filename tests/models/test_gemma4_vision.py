"""Gemma 4's vision tower, pooler and embedder, and the embedding graph, against transformers
(fp32, 1e-4), on images already at a size the image processor keeps; a mutant per mechanism of
the tower fails."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_genai.components import gemma4_vision
from mobius_genai.config.gemma4_vision import parse_gemma4_vision_language
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models.image_processors import gemma4_transforms
from mobius_genai.models.vision_language import VISION_LANGUAGE
from tests._gemma4_vision import (
    IMAGE_TOKEN,
    TEXT_HIDDEN,
    image_inputs,
    image_tokens,
    random_pixels,
    reference_embeddings,
    reference_features,
    sessions,
    tiny_gemma4,
    vision_graphs,
)
from tests._ort import model_ops

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
#: (height, width) pixels of 4-pixel patches pooled 3 x 3: 6 x 9 patches (more columns than
#: rows), 9 x 6, 3 x 12 (one row of tokens), 12 x 12.
SIZES = ((24, 36), (36, 24), (12, 48), (48, 48))


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    model = tiny_gemma4()
    folder = tmp_path_factory.mktemp("gemma4")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module", params=EPS)
def graphs(request, gemma4):
    return sessions(vision_graphs(*gemma4, request.param))


@pytest.mark.parametrize("sizes", [[size] for size in SIZES] + [list(SIZES)])
def test_vision_graph_matches_transformers(gemma4, graphs, sizes):
    """One image of each size, and the four in one run: transformers pads each to the longest
    image's patch count with (-1, -1) positions, which the graph masks and drops."""
    model, _ = gemma4
    inputs = image_inputs([random_pixels(*size, seed=1) for size in sizes])
    ours = graphs["vision"].run(None, inputs)[0]
    expected = reference_features(model, inputs)
    assert ours.shape == (
        sum(image_tokens(random_pixels(*size, seed=1)) for size in sizes),
        TEXT_HIDDEN,
    )
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)


def test_vision_graph_takes_unpadded_patches_as_og_feeds_them(gemma4, graphs):
    """og trims the processor's padding: the same image without padding patches gives the
    same features."""
    model, _ = gemma4
    pixels = random_pixels(*SIZES[0], seed=1)
    padded = image_inputs([pixels], length=90)
    trimmed = image_inputs([pixels])
    assert padded["pixel_values"].shape[1] > trimmed["pixel_values"].shape[1]
    ours = graphs["vision"].run(None, trimmed)[0]
    np.testing.assert_allclose(ours, reference_features(model, padded), atol=TOLERANCE, rtol=0)


def test_embedding_graph_places_the_features_as_transformers_does(gemma4, graphs):
    model, _ = gemma4
    inputs = image_inputs([random_pixels(*SIZES[0], seed=1)])
    features = reference_features(model, inputs)
    input_ids = np.array([[2, 5, 291, *[IMAGE_TOKEN] * len(features), 292, 7, 8]], np.int64)
    (embeds,) = graphs["embedding"].run(None, {"input_ids": input_ids, "image_features": features})
    expected = reference_embeddings(model, input_ids, features)
    np.testing.assert_allclose(embeds, expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("ep", ["cpu", "cuda", "onnx-standard"])
def test_graph_ops_per_ep_and_role(gemma4, ep):
    """Every EP: the tower's attention stays standard Attention with the padding mask (it is
    bidirectional), the pooling a MatMul of one-hot weights and a Compress; onnx-standard:
    nothing outside the standard domain."""
    graphs = vision_graphs(*gemma4, ep, dtype=None)
    vision = model_ops(graphs["vision"])
    assert {("", "Attention"), ("", "Compress"), ("", "Clip"), ("", "RMSNormalization")} <= vision
    for key, graph in graphs.items():
        ops = model_ops(graph)
        assert ("com.microsoft", "GroupQueryAttention") not in ops, key
        if ep == "onnx-standard":
            assert {domain for domain, _ in ops} <= {"", "ai.onnx"}, key


class _RowsAsColumns(gemma4_vision.AxialRotary):
    """Rotates the first half of each head by the row and the second by the column."""

    def __init__(self, op, positions, config):
        swapped = op.Gather(positions, op.Constant(value_ints=[1, 0]), axis=-1)
        super().__init__(op, swapped, config)


class _TableAxesSwapped(gemma4_vision._PatchEmbedder):
    """Reads the column's position from the row table and the row's from the column table."""

    def forward(self, op, pixel_values, clamped, padding):
        swapped = op.Gather(clamped, op.Constant(value_ints=[1, 0]), axis=-1)
        return super().forward(op, pixel_values, swapped, padding)


class _PoolColumnMajor(gemma4_vision.Gemma4VisionTower):
    """Pools the k x k blocks column-major instead of row-major."""

    def pool_index(self, op, clamped):
        return super().pool_index(op, op.Gather(clamped, op.Constant(value_ints=[1, 0]), axis=-1))


@pytest.mark.parametrize(
    ("name", "mutant"),
    [
        ("AxialRotary", _RowsAsColumns),
        ("_PatchEmbedder", _TableAxesSwapped),
        ("Gemma4VisionTower", _PoolColumnMajor),
    ],
)
def test_a_mutant_of_each_position_mechanism_fails(gemma4, monkeypatch, name, mutant):
    """Rotary axes swapped, position tables swapped, pooling blocks in the wrong order: each
    moves the features of a 6 x 9 patch image well past the tolerance."""
    model, folder = gemma4
    monkeypatch.setattr(gemma4_vision, name, mutant)
    inputs = image_inputs([random_pixels(*SIZES[0], seed=1)])
    ours = sessions(vision_graphs(model, folder))["vision"].run(None, inputs)[0]
    assert np.abs(ours - reference_features(model, inputs)).max() > 100 * TOLERANCE


@pytest.mark.parametrize(
    "changes",
    [{"use_clipped_linears": False}, {"standardize": False}, {"rope_theta": 10_000.0}],
)
def test_a_mutant_of_each_setting_fails(gemma4, changes):
    """The clamps of the clipped linears, the standardization and the rotary base each change
    the features: building without one (or with another base) fails parity."""
    model, folder = gemma4
    inputs = image_inputs([random_pixels(*SIZES[0], seed=1)])
    ours = sessions(vision_graphs(model, folder, **changes))["vision"].run(None, inputs)[0]
    assert np.abs(ours - reference_features(model, inputs)).max() > 100 * TOLERANCE


def test_a_tower_without_clamps_or_standardization_matches_transformers(tmp_path):
    """transformers' defaults (no clipped linears, no standardization): the graph has neither
    the clamps nor the standardization's parameters."""
    model = tiny_gemma4(use_clipped_linears=False, standardize=False)
    model.save_pretrained(tmp_path)
    graphs = vision_graphs(model, tmp_path)
    assert ("", "Clip") not in model_ops(graphs["vision"])
    inputs = image_inputs([random_pixels(*SIZES[1], seed=1)])
    ours = sessions(graphs)["vision"].run(None, inputs)[0]
    np.testing.assert_allclose(ours, reference_features(model, inputs), atol=TOLERANCE, rtol=0)


def _raw(model, **vision) -> dict:
    raw = model.config.to_dict()
    raw["vision_config"] = {**raw["vision_config"], **vision}
    return raw


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"pooling_kernel_size": 2}, "'vision_config.pooling_kernel_size' is 2"),
        ({"rope_parameters": {"rope_type": "default"}}, "rope_type' is 'default'"),
        ({"hidden_activation": "tanh"}, "'vision_config.hidden_activation' is 'tanh'"),
        ({"head_dim": 6}, "vision_config.head_dim 6"),
    ],
)
def test_configs_the_graph_cannot_express_are_refused_in_one_line(gemma4, changes, named):
    from tests._gemma4_vision import _config

    model, _ = gemma4
    text = _config(model).text
    with pytest.raises(ConfigError) as error:
        parse_gemma4_vision_language(_raw(model, **changes), text)
    message = str(error.value)
    assert named in message and "\n" not in message


@pytest.mark.parametrize(("value", "both_ways"), [(None, False), ("vision", True)])
def test_image_tokens_attend_both_ways_as_the_config_says(gemma4, value, both_ways):
    """Gemma 4's larger checkpoints set use_bidirectional_attention "vision" (an image's
    tokens attend to each other both ways in the sliding layers); the smaller ones leave it
    null (causal)."""
    model, _ = gemma4
    raw = model.config.to_dict()
    raw["text_config"] = {**raw["text_config"], "use_bidirectional_attention": value}
    assert VISION_LANGUAGE["gemma4"].parse_config(raw).bidirectional_images is both_ways


def test_attention_both_ways_everywhere_is_refused_in_one_line(gemma4):
    """use_bidirectional_attention "all" (no causal mask: an encoder) is no decoder og runs."""
    model, _ = gemma4
    raw = model.config.to_dict()
    raw["text_config"] = {**raw["text_config"], "use_bidirectional_attention": "all"}
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention is 'all'") as e:
        VISION_LANGUAGE["gemma4"].parse_config(raw)
    assert "\n" not in str(e.value)


def test_a_gemma4_config_without_a_vision_tower_is_refused_in_one_line(gemma4):
    from tests._gemma4_vision import _config

    model, _ = gemma4
    raw = {**model.config.to_dict(), "vision_config": None}
    with pytest.raises(ConfigError, match="no vision tower") as error:
        parse_gemma4_vision_language(raw, _config(model).text)
    assert "\n" not in str(error.value)


def test_processor_transforms_are_og_gemma4_image_transform(gemma4, tmp_path):
    """Decode as RGB (no ConvertRGB: og then feeds transformers' channel order), then og's
    Gemma4ImageTransform with the tower's patch and pooling sizes and the checkpoint's token
    budget; budgets transformers refuses, and normalizing, are refused in one line."""
    from tests._gemma4_vision import _config

    model, _ = gemma4
    vision = _config(model).vision
    path = tmp_path / "preprocessor_config.json"
    transforms = gemma4_transforms({"max_soft_tokens": 70}, vision, path)
    assert transforms == [
        ("decode_image", "DecodeImage", {"color_space": "RGB"}),
        (
            "gemma4_image_transform",
            "Gemma4ImageTransform",
            {"patch_size": 4, "max_soft_tokens": 70, "pooling_kernel_size": 3},
        ),
    ]
    assert gemma4_transforms({}, vision, path)[1][2]["max_soft_tokens"] == 280
    for settings, named in (
        ({"max_soft_tokens": 100}, "100"),
        ({"do_normalize": True}, "do_normalize"),
    ):
        with pytest.raises(ConfigError, match=named) as error:
            gemma4_transforms(settings, vision, path)
        assert str(path) in str(error.value) and "\n" not in str(error.value)
