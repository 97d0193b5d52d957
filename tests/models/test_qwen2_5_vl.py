"""Qwen2.5-VL's vision, embedding and decoder graphs against transformers (fp32, 1e-4)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

from mobius_genai.build import build
from tests._ort import (
    assert_only_the_decoder_fuses_gqa,
    decode_like_transformers,
    model_ops,
    package_sessions,
)
from tests._qwen_vl import (
    IMAGE_TOKEN,
    TEXT_HIDDEN,
    image_prompt,
    patches,
    tiny_qwen2_5_vl,
    transformers_prefill,
)

TOLERANCE = 1e-4
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    model = tiny_qwen2_5_vl()
    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    model.save_pretrained(folder)
    return model, folder


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs by name, fed the inputs the graph declares (an unread input_ids is removed)."""
    names = [value.name for value in session.get_outputs()]
    declared = {value.name for value in session.get_inputs()}
    outputs = session.run(None, {k: v for k, v in feeds.items() if k in declared})
    return dict(zip(names, outputs, strict=True))


def _image(height: int, width: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _reference_features(model, pixel_values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        output = model.model.get_image_features(
            torch.from_numpy(pixel_values), torch.from_numpy(grid)
        )
    return torch.cat(output.pooler_output).numpy()


@pytest.mark.parametrize("size", [(40, 56), (32, 32), (16, 48)])
def test_vision_graph_matches_transformers_over_several_windows(qwen, size):
    """5 x 7 merged tokens in 3 x 4 windows (partial ones at the edges), 4 x 4 in 2 x 2, and
    2 x 6 in 1 x 3: the window order and its inverse, full-attention block 1 between them."""
    model, folder = qwen
    package = build(folder, "cpu", "fp32", progress=False)
    pixel_values, grid = patches(_image(*size))
    features = _run(
        package_sessions(package)["vision"], {"pixel_values": pixel_values, "image_grid_thw": grid}
    )["image_features"]
    reference = _reference_features(model, pixel_values, grid)
    assert features.shape == reference.shape == (int(grid.prod()) // 4, TEXT_HIDDEN)
    np.testing.assert_allclose(features, reference, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard"])
def test_graphs_match_transformers_over_prefill_and_decode(qwen, ep):
    assert_graphs_match_transformers(*qwen, ep)


def assert_graphs_match_transformers(model, folder, ep: str) -> list[int]:
    """A Qwen-VL checkpoint's three graphs, built for `ep`, against transformers with one
    40 x 56 image: features, merged embeddings, prefill logits at its 3-D mrope positions,
    then decode steps (fp32, 1e-4). Returns the greedy tokens decoded."""
    sessions = package_sessions(build(folder, ep, "fp32", progress=False))
    pixel_values, grid = patches(_image(40, 56))
    ids = image_prompt(grid)
    image = {"pixel_values": pixel_values, "image_grid_thw": grid}
    features = _run(sessions["vision"], image)["image_features"]
    with torch.no_grad():
        features_ref = torch.from_numpy(_reference_features(model, pixel_values, grid))
        embeds_ref = model.model.get_input_embeddings()(ids)
        embeds_ref = embeds_ref.masked_scatter((ids == IMAGE_TOKEN)[..., None], features_ref)
    positions, reference = transformers_prefill(model, ids, pixel_values, grid)
    embeds = _run(sessions["embedding"], {"input_ids": ids.numpy(), "image_features": features})
    embeds = embeds["inputs_embeds"]
    np.testing.assert_allclose(embeds, embeds_ref.numpy(), atol=TOLERANCE, rtol=0)
    seq = ids.shape[1]
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    past = {
        f"past_key_values.{i}.{kind}": empty for i in range(LAYERS) for kind in ("key", "value")
    }
    feeds = {
        "inputs_embeds": embeds,
        "input_ids": ids.numpy(),
        "attention_mask": np.ones((1, seq), np.int64),
        "position_ids": positions.numpy(),
        **past,
    }
    outputs = _run(sessions["decoder"], feeds)
    np.testing.assert_allclose(outputs["logits"], reference.logits.numpy(), atol=TOLERANCE, rtol=0)
    delta = int(model.model.rope_deltas[0, 0])
    return decode_like_transformers(model, sessions, outputs, reference, mrope_delta=delta)


def test_graph_io_is_what_onnxruntime_genai_feeds(qwen):
    """vision: pixel_values [patches, 3·2·patch²] and image_grid_thw [1, 3] (og loops over
    images); decoder: position_ids [3, batch, seq], the 3-D mrope positions og computes."""
    _, folder = qwen
    package = build(folder, "cpu", "fp32", load_weights=False, progress=False)
    vision = {value.name: value for value in package["vision"].graph.inputs}
    assert vision["pixel_values"].shape.rank() == 2
    assert vision["pixel_values"].shape[1] == 3 * 2 * 4 * 4
    assert list(vision["image_grid_thw"].shape) == [1, 3]
    assert vision["image_grid_thw"].dtype == ir.DataType.INT64
    decoder = {value.name: value for value in package["decoder"].graph.inputs}
    assert decoder["position_ids"].shape[0] == 3 and decoder["position_ids"].shape.rank() == 3


@pytest.mark.parametrize("ep", ["cpu", "cuda", "onnx-standard"])
def test_graph_ops_per_ep(qwen, ep, recwarn):
    _, folder = qwen
    package = build(folder, ep, load_weights=False, progress=False)
    assert_only_the_decoder_fuses_gqa(package, ep)
    if ep != "onnx-standard":  # the decoder's causal attention fuses, mrope rotated in front
        assert ("com.microsoft", "GroupQueryAttention") in model_ops(package["decoder"])
    assert not [w for w in recwarn if "GQA fusion expected" in str(w.message)]


def test_skipping_the_window_order_is_caught(qwen, monkeypatch):
    """The mutant: patches left in image order (and not put back) while the bias still
    expects window order; the features then differ from transformers'."""
    from mobius_genai.components import qwen_vision

    original = qwen_vision.WindowLayout.__init__

    def unordered(self, op, grid, config):
        original(self, op, grid, config)
        one, zero = op.Constant(value_int=1), op.Constant(value_int=0)
        self.patch_order = op.Range(zero, op.Size(self.patch_order), one)
        self.inverse = op.Range(zero, op.Size(self.inverse), one)

    monkeypatch.setattr(qwen_vision.WindowLayout, "__init__", unordered)
    model, folder = qwen
    pixel_values, grid = patches(_image(40, 56))
    session = package_sessions(build(folder, "cpu", "fp32", progress=False))["vision"]
    features = _run(session, {"pixel_values": pixel_values, "image_grid_thw": grid})
    error = np.abs(features["image_features"] - _reference_features(model, pixel_values, grid))
    assert error.max() > 100 * TOLERANCE
