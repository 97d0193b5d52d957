"""Qwen3-VL's vision, embedding and decoder graphs against transformers (fp32, 1e-4): the
learned position grid resampled to each image size, DeepStack features carried in wider
embeddings and added after the decoder's first layers, interleaved mrope."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mobius_genai.build import build
from tests._ort import decode_like_transformers, model_ops, package_sessions, run_declared
from tests._qwen3_vl import DEEPSTACK, hub_experts, tiny_qwen3_vl
from tests._qwen_vl import (
    IMAGE_TOKEN,
    TEXT_HIDDEN,
    image_prompt,
    patches,
    token_types,
    transformers_prefill,
)
from tests.models.test_qwen2_5_vl import _image

TOLERANCE = 1e-4
LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 16
WIDTH = TEXT_HIDDEN * (1 + len(DEEPSTACK))
PACKED = ("com.microsoft", "PackedMultiHeadAttention")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    model = tiny_qwen3_vl()
    folder = tmp_path_factory.mktemp("qwen3_vl")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """Qwen3-VL-MoE: the same tower, a qwen3_moe decoder; experts in the hub's layout."""
    model = tiny_qwen3_vl(moe=True)
    folder = tmp_path_factory.mktemp("qwen3_vl_moe")
    model.save_pretrained(folder)
    hub_experts(folder)
    return model, folder


@pytest.fixture(scope="module")
def qwen3_moe_saved(tmp_path_factory):
    """Qwen3-VL-MoE as transformers 5's save_pretrained writes it: experts [E, 2I, H] and
    [E, H, I], the transpose of the hub's."""
    model = tiny_qwen3_vl(moe=True)
    folder = tmp_path_factory.mktemp("qwen3_vl_moe_saved")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def qwen3_moe_square(tmp_path_factory):
    """Experts as save_pretrained writes them, gate_up_proj square (H == 2I): only down_proj
    shows that they are not the hub's."""
    model = tiny_qwen3_vl({"moe_intermediate_size": TEXT_HIDDEN // 2}, moe=True)
    folder = tmp_path_factory.mktemp("qwen3_vl_moe_square")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def sessions(qwen3):
    return package_sessions(build(qwen3[1], "cpu", "fp32", progress=False))


def _reference(model, pixel_values: np.ndarray, grid: np.ndarray):
    """transformers' merged tokens and DeepStack features, side by side as ours are."""
    with torch.no_grad():
        output = model.model.get_image_features(
            torch.from_numpy(pixel_values), torch.from_numpy(grid)
        )
    merged = torch.cat(output.pooler_output)
    deepstack = [torch.cat(feature) for feature in output.deepstack_features]
    return torch.cat([merged, *deepstack], dim=-1).numpy(), merged, deepstack


def _features(sessions, pixel_values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    feeds = {"pixel_values": pixel_values, "image_grid_thw": grid}
    return run_declared(sessions["vision"], feeds)["image_features"]


@pytest.mark.parametrize("size", [(40, 56), (32, 32), (16, 48)])
def test_vision_graph_matches_transformers_at_several_image_sizes(qwen3, sessions, size):
    """5 x 7, 4 x 4 and 2 x 6 merged tokens: the 4 x 4 position grid resampled to 10 x 14,
    8 x 8 and 4 x 12 patches, and the DeepStack mergers of blocks 0 and 2."""
    model, _ = qwen3
    pixel_values, grid = patches(_image(*size))
    reference, _, _ = _reference(model, pixel_values, grid)
    features = _features(sessions, pixel_values, grid)
    assert features.shape == reference.shape == (int(grid.prod()) // 4, WIDTH)
    np.testing.assert_allclose(features, reference, atol=TOLERANCE, rtol=0)


def _empty_past() -> dict[str, np.ndarray]:
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    return {f"past_key_values.{i}.{k}": empty for i in range(LAYERS) for k in ("key", "value")}


def test_the_fp16_vision_graph_runs_near_transformers(qwen3):
    """fp16 (the cpu EP's other dtype; cuda's default): the position grid's float32 weights
    cast to the build dtype, so onnxruntime loads the graph; its features stay within fp16
    rounding of transformers' float32 ones."""
    model, folder = qwen3
    session = package_sessions(build(folder, "cpu", "fp16", progress=False))["vision"]
    pixel_values, grid = patches(_image(40, 56))
    reference, _, _ = _reference(model, pixel_values, grid)
    feeds = {"pixel_values": pixel_values.astype(np.float16), "image_grid_thw": grid}
    features = run_declared(session, feeds)["image_features"].astype(np.float32)
    np.testing.assert_allclose(features, reference, atol=5e-3 * np.abs(reference).max(), rtol=0)


def _decoder_feeds(embeds, ids, total, positions, past) -> dict[str, np.ndarray]:
    return {
        "inputs_embeds": embeds,
        "input_ids": ids,
        "attention_mask": np.ones((1, total), np.int64),
        "position_ids": positions,
        **past,
    }


@pytest.mark.parametrize(
    ("checkpoint", "ep"),
    [
        ("qwen3", "cpu"),
        ("qwen3", "onnx-standard"),
        ("qwen3_moe", "cpu"),
        ("qwen3_moe", "onnx-standard"),
        ("qwen3_moe_saved", "cpu"),
        ("qwen3_moe_square", "cpu"),
    ],
)
def test_graphs_match_transformers_over_prefill_and_decode(request, checkpoint, ep):
    model, folder = request.getfixturevalue(checkpoint)
    sessions = package_sessions(build(folder, ep, "fp32", progress=False))
    pixel_values, grid = patches(_image(40, 56))
    ids = image_prompt(grid)
    features = _features(sessions, pixel_values, grid)
    _, merged, deepstack = _reference(model, pixel_values, grid)
    with torch.no_grad():
        mask = (ids == IMAGE_TOKEN)[..., None]
        embeds_ref = model.model.get_input_embeddings()(ids).masked_scatter(mask, merged)
        parts = [torch.zeros_like(embeds_ref).masked_scatter(mask, part) for part in deepstack]
    positions, reference = transformers_prefill(model, ids, pixel_values, grid)
    embeds = run_declared(
        sessions["embedding"], {"input_ids": ids.numpy(), "image_features": features}
    )
    embeds = embeds["inputs_embeds"]
    expected = torch.cat([embeds_ref, *parts], dim=-1).numpy()
    np.testing.assert_allclose(embeds, expected, atol=TOLERANCE, rtol=0)
    seq = ids.shape[1]
    outputs = run_declared(
        sessions["decoder"],
        _decoder_feeds(embeds, ids.numpy(), seq, positions.numpy(), _empty_past()),
    )
    np.testing.assert_allclose(outputs["logits"], reference.logits.numpy(), atol=TOLERANCE, rtol=0)
    delta = int(model.model.rope_deltas[0, 0])
    decode_like_transformers(model, sessions, outputs, reference, mrope_delta=delta)


def test_graph_io_carries_deepstack_in_wider_embeddings(qwen3):
    """image_features and inputs_embeds are hidden x (1 + DeepStack layers) wide; og sizes
    both by genai_config's decoder.hidden_size (tests/models/test_qwen3_vl_bundle.py)."""
    _, folder = qwen3
    package = build(folder, "cpu", "fp32", load_weights=False, progress=False)
    vision = {value.name: value for value in package["vision"].graph.inputs}
    assert list(vision["image_grid_thw"].shape) == [1, 3]
    assert vision["pixel_values"].shape[1] == 3 * 2 * 4 * 4
    assert package["vision"].graph.outputs[0].shape[1] == WIDTH
    embedding = {value.name: value for value in package["embedding"].graph.inputs}
    assert embedding["image_features"].shape[1] == WIDTH
    assert package["embedding"].graph.outputs[0].shape[2] == WIDTH
    decoder = {value.name: value for value in package["decoder"].graph.inputs}
    assert decoder["inputs_embeds"].shape[2] == WIDTH
    assert decoder["position_ids"].shape[0] == 3 and decoder["position_ids"].shape.rank() == 3


@pytest.mark.parametrize("ep", ["cpu", "cuda", "dml", "webgpu", "onnx-standard"])
def test_graph_ops_per_ep_and_role(qwen3, ep, recwarn):
    _, folder = qwen3
    package = build(folder, ep, load_weights=False, progress=False)
    for key, model in package.items():
        ops = model_ops(model)
        if key != "decoder":
            assert ("com.microsoft", "GroupQueryAttention") not in ops, key
        if key != "vision":
            assert PACKED not in ops, key
        if ep == "onnx-standard":
            assert {domain for domain, _ in ops} <= {"", "ai.onnx"}, key
    if ep != "onnx-standard":  # the decoder's causal attention fuses, mrope rotated in front
        assert ("com.microsoft", "GroupQueryAttention") in model_ops(package["decoder"])
    # onnxruntime has the kernel for CUDA only; elsewhere its standard body is inlined
    assert (PACKED in model_ops(package["vision"])) == (ep == "cuda")
    assert not [w for w in recwarn if "GQA fusion expected" in str(w.message)]


@pytest.mark.parametrize("size", [(40, 56), (16, 48)])
def test_the_cuda_vision_graph_body_matches_transformers(qwen3, size):
    """The cuda graph keeps PackedMultiHeadAttention (one sequence per frame); its standard
    body, inlined, run by onnxruntime on CPU, gives transformers' features."""
    from onnx_ir.passes.common import InlinePass

    model, folder = qwen3
    vision = build(folder, "cuda", "fp32", progress=False)["vision"]
    packed = [node for node in vision.graph.all_nodes() if node.op_type == PACKED[1]]
    assert len(packed) == model.config.vision_config.depth  # one per block
    InlinePass(criteria=lambda function: function.name == PACKED[1])(vision)
    assert PACKED not in model_ops(vision)
    pixel_values, grid = patches(_image(*size))
    session = package_sessions({"vision": vision})["vision"]
    reference, _, _ = _reference(model, pixel_values, grid)
    features = _features({"vision": session}, pixel_values, grid)
    np.testing.assert_allclose(features, reference, atol=TOLERANCE, rtol=0)


def _vision_error(qwen3) -> float:
    model, folder = qwen3
    pixel_values, grid = patches(_image(40, 56))
    session = package_sessions(build(folder, "cpu", "fp32", progress=False))["vision"]
    reference, _, _ = _reference(model, pixel_values, grid)
    return float(np.abs(_features({"vision": session}, pixel_values, grid) - reference).max())


def _prefill_error(qwen3) -> float:
    """Largest logit error of the prefill with one image (transformers' features and
    positions, so only the decoder and embedding graphs are under test)."""
    model, folder = qwen3
    sessions = package_sessions(build(folder, "cpu", "fp32", progress=False))
    pixel_values, grid = patches(_image(40, 56))
    ids = image_prompt(grid)
    features, _, _ = _reference(model, pixel_values, grid)
    with torch.no_grad():
        positions, _ = model.model.get_rope_index(
            ids, token_types(ids), image_grid_thw=torch.from_numpy(grid)
        )
        reference = model(
            input_ids=ids,
            pixel_values=torch.from_numpy(pixel_values),
            image_grid_thw=torch.from_numpy(grid),
            mm_token_type_ids=token_types(ids),
        ).logits.numpy()
    embeds = run_declared(
        sessions["embedding"], {"input_ids": ids.numpy(), "image_features": features}
    )
    feeds = _decoder_feeds(
        embeds["inputs_embeds"], ids.numpy(), ids.shape[1], positions.numpy(), _empty_past()
    )
    return float(np.abs(run_declared(sessions["decoder"], feeds)["logits"] - reference).max())


def _swapped_rope_axes(monkeypatch):
    from mobius_genai.components import qwen3_vision

    original = qwen3_vision.AxialRotary

    def swapped(op, layout, config):
        return original(op, type("Layout", (), {"row": layout.col, "col": layout.row}), config)

    monkeypatch.setattr(qwen3_vision, "AxialRotary", swapped)


def _merge_off_by_one(monkeypatch):
    from mobius_genai.components import qwen3_vision

    original = qwen3_vision.Qwen3PatchMerger.forward

    def shifted(self, op, x):  # the m² patches of each token taken one patch later
        rolled = op.Concat(
            op.Slice(x, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62])),
            op.Slice(x, op.Constant(value_ints=[0]), op.Constant(value_ints=[1])),
            axis=0,
        )
        return original(self, op, rolled)

    monkeypatch.setattr(qwen3_vision.Qwen3PatchMerger, "forward", shifted)


def _deepstack_layer_off_by_one(monkeypatch):
    from mobius_genai.models import causal_lm

    original = causal_lm.split_deepstack

    def later(op, embeds, layers):  # the k-th part added after layer k + 1
        first, rest = original(op, embeds, layers)
        return first, [op.Sub(first, first), *rest]

    monkeypatch.setattr(causal_lm, "split_deepstack", later)


def _mrope_not_interleaved(monkeypatch):
    import dataclasses

    from mobius_genai.components import rope

    original = rope.channel_axes

    def chunked(config, pairs):
        return original(dataclasses.replace(config, mrope_interleaved=False), pairs)

    monkeypatch.setattr(rope, "channel_axes", chunked)


@pytest.mark.parametrize(
    ("mutant", "error"),
    [
        (_swapped_rope_axes, _vision_error),
        (_merge_off_by_one, _vision_error),
        (_deepstack_layer_off_by_one, _prefill_error),
        (_mrope_not_interleaved, _prefill_error),
    ],
)
def test_mutants_are_caught(qwen3, monkeypatch, mutant, error):
    """Each mutant (vision rope's row and column swapped, the merger's patches one off,
    DeepStack parts added one layer late, the decoder's mrope sections in turn instead of
    interleaved) moves the graphs far from transformers; unmutated they agree."""
    assert error(qwen3) < TOLERANCE
    mutant(monkeypatch)
    assert error(qwen3) > 100 * TOLERANCE


@pytest.mark.parametrize("ep", ["cpu", "onnx-standard"])
def test_the_moe_decoder_ops_per_ep(qwen3_moe, ep):
    """Qwen3-VL-MoE's decoder: com.microsoft::MoE where the EP keeps it (cpu), its standard
    body for onnx-standard; the vision and embedding graphs are the dense model's."""
    _, folder = qwen3_moe
    package = build(folder, ep, load_weights=False, progress=False)
    decoder = model_ops(package["decoder"])
    assert (("com.microsoft", "MoE") in decoder) == (ep == "cpu")
    if ep == "onnx-standard":
        for key, model in package.items():
            assert {domain for domain, _ in model_ops(model)} <= {"", "ai.onnx"}, key
    assert package["decoder"].graph.inputs[0].shape[2] == WIDTH  # inputs_embeds


def test_a_tied_lm_head_matches_transformers(tmp_path):
    """Qwen3-VL-2B/4B tie the LM head to the embeddings (the top level's switch): the decoder
    reads the embedding graph's table under one name."""
    model = tiny_qwen3_vl(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    assert _prefill_error((model, tmp_path)) < TOLERANCE
