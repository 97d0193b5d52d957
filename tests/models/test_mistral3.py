"""Mistral 3's vision, embedding and decoder graphs against transformers (fp32, 1e-4)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from mobius_genai.build import build
from mobius_genai.errors import ConfigError
from tests._mistral3 import (
    IMAGE_TOKEN,
    TEXT_HIDDEN,
    image_prompt,
    pixel_values,
    reference_features,
    tiny_mistral3,
)
from tests._ort import (
    assert_only_the_decoder_fuses_gqa,
    decode_like_transformers,
    model_ops,
    package_sessions,
    run_declared,
)

TOLERANCE = 1e-4
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory):
    model = tiny_mistral3()
    folder = tmp_path_factory.mktemp("mistral3")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def sessions(mistral3) -> dict[str, ort.InferenceSession]:
    return package_sessions(build(mistral3[1], "cpu", "fp32", progress=False))


def _image(height: int, width: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _features(session: ort.InferenceSession, pixels: np.ndarray) -> np.ndarray:
    return session.run(None, {"pixel_values": pixel_values(pixels)})[0]


@pytest.mark.parametrize("size", [(24, 40), (48, 16)])
def test_vision_and_embedding_graphs_match_transformers_for_images_of_any_size(
    mistral3, sessions, size
):
    """3 x 5 image tokens of 6 x 10 patches, and 6 x 2 of 12 x 4: the 2-D rotary over rows and
    columns of unequal counts and the 2 x 2 merge, one graph for both sizes; the embedding
    graph places the features at the [IMG] tokens, between [IMG_BREAK]s and [IMG_END]."""
    model, _ = mistral3
    pixels = _image(*size)
    features = _features(sessions["vision"], pixels)
    reference = reference_features(model, pixels)
    assert features.shape == reference.shape == (size[0] * size[1] // 64, TEXT_HIDDEN)
    np.testing.assert_allclose(features, reference, atol=TOLERANCE, rtol=0)
    ids = image_prompt(*size)
    with torch.no_grad():
        embeds_ref = model.model.get_input_embeddings()(ids).masked_scatter(
            (ids == IMAGE_TOKEN)[..., None], torch.from_numpy(reference)
        )
    embeds = run_declared(
        sessions["embedding"], {"input_ids": ids.numpy(), "image_features": features}
    )["inputs_embeds"]
    np.testing.assert_allclose(embeds, embeds_ref.numpy(), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard"])
def test_graphs_match_transformers_over_prefill_and_decode(mistral3, ep):
    model, folder = mistral3
    graphs = package_sessions(build(folder, ep, "fp32", progress=False))
    pixels = _image(24, 40)
    ids = image_prompt(24, 40)
    features = _features(graphs["vision"], pixels)
    with torch.no_grad():
        features_ref = torch.from_numpy(reference_features(model, pixels))
        embeds_ref = model.model.get_input_embeddings()(ids)
        embeds_ref = embeds_ref.masked_scatter((ids == IMAGE_TOKEN)[..., None], features_ref)
        reference = model(
            input_ids=ids,
            pixel_values=torch.from_numpy(pixel_values(pixels)),
            image_sizes=torch.tensor([[24, 40]]),
            use_cache=True,
        )
    embeds = run_declared(
        graphs["embedding"], {"input_ids": ids.numpy(), "image_features": features}
    )
    embeds = embeds["inputs_embeds"]
    np.testing.assert_allclose(embeds, embeds_ref.numpy(), atol=TOLERANCE, rtol=0)
    seq = ids.shape[1]
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    feeds = {
        "inputs_embeds": embeds,
        "input_ids": ids.numpy(),
        "attention_mask": np.ones((1, seq), np.int64),
        "position_ids": np.arange(seq)[None],
        **{
            f"past_key_values.{i}.{kind}": empty for i in range(LAYERS) for kind in ("key", "value")
        },
    }
    outputs = run_declared(graphs["decoder"], feeds)
    np.testing.assert_allclose(outputs["logits"], reference.logits.numpy(), atol=TOLERANCE, rtol=0)
    decode_like_transformers(model, graphs, outputs, reference)


def test_vision_graph_takes_one_image_at_its_size(mistral3):
    """pixel_values [1, 3, height, width] (og slices each image out and runs the graph once per
    image); the decoder takes the embedding graph's output."""
    _, folder = mistral3
    package = build(folder, "cpu", "fp32", load_weights=False, progress=False)
    (pixels,) = package["vision"].graph.inputs
    assert pixels.name == "pixel_values"
    assert list(pixels.shape)[:2] == [1, 3]
    assert not all(isinstance(dim, int) for dim in pixels.shape)
    decoder = {value.name for value in package["decoder"].graph.inputs}
    assert "inputs_embeds" in decoder


@pytest.mark.parametrize("ep", ["cpu", "cuda", "onnx-standard"])
def test_graph_ops_per_ep_and_role(mistral3, ep, recwarn):
    _, folder = mistral3
    package = build(folder, ep, load_weights=False, progress=False)
    assert_only_the_decoder_fuses_gqa(package, ep)
    assert ("", "Attention") in model_ops(package["vision"])
    decoder = model_ops(package["decoder"])
    fused = ("com.microsoft", "GroupQueryAttention") in decoder
    assert fused == (ep != "onnx-standard")
    assert not [w for w in recwarn if "GQA fusion expected" in str(w.message)]


def _mutant_error(mistral3, monkeypatch, module, name, replacement) -> float:
    monkeypatch.setattr(module, name, replacement)
    model, folder = mistral3
    session = package_sessions(build(folder, "cpu", "fp32", progress=False))["vision"]
    pixels = _image(24, 40)
    return float(np.abs(_features(session, pixels) - reference_features(model, pixels)).max())


def test_swapped_rotary_axes_are_caught(mistral3, monkeypatch):
    """The mutant: rows rotated as columns and columns as rows."""
    from mobius_genai.components import pixtral_vision

    original = pixtral_vision.patch_grid

    def swapped(op, height, width):
        rows, cols = original(op, height, width)
        return cols, rows

    error = _mutant_error(mistral3, monkeypatch, pixtral_vision, "patch_grid", swapped)
    assert error > 100 * TOLERANCE


def test_merge_off_by_one_patch_is_caught(mistral3, monkeypatch):
    """The mutant: the merger's blocks start one patch later (the patches rolled by one)."""
    from mobius_genai.components import pixtral_vision

    original = pixtral_vision.PatchMerger.forward

    def shifted(self, op, x, grid):
        ints = op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62])
        start = op.Constant(value_ints=[0])
        rolled = op.Concat(op.Slice(x, *ints), op.Slice(x, start, ints[0]), axis=0)
        return original(self, op, rolled, grid)

    error = _mutant_error(mistral3, monkeypatch, pixtral_vision.PatchMerger, "forward", shifted)
    assert error > 100 * TOLERANCE


def _config(folder, **changes) -> dict:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        target = config
        *path, last = key.split("__")
        for part in path:
            target = target[part]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return config


def test_the_top_level_says_whether_the_head_is_tied(mistral3, tmp_path):
    """transformers ties by the top level's tie_word_embeddings, true where absent."""
    from mobius_genai.models.vision_language import vision_language_family

    _, folder = mistral3
    family = vision_language_family("mistral3")
    untied = family.parse_config(_config(folder))
    tied = family.parse_config(_config(folder, tie_word_embeddings=None))
    assert (untied.text.tie_word_embeddings, tied.text.tie_word_embeddings) == (False, True)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"vision_feature_layer": -2}, "'vision_feature_layer' is -2"),
        ({"vision_config__rope_parameters": {"rope_type": "default"}}, "rope_type' is 'default'"),
        ({"vision_config__hidden_act": "tanh"}, "'vision_config.hidden_act' is 'tanh'"),
    ],
)
def test_configs_the_graph_cannot_express_are_refused_in_one_line(mistral3, changes, named):
    from mobius_genai.models.vision_language import vision_language_family

    _, folder = mistral3
    with pytest.raises(ConfigError, match="accepted") as error:
        vision_language_family("mistral3").parse_config(_config(folder, **changes))
    assert named in str(error.value) and "\n" not in str(error.value)
