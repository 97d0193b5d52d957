"""Gemma 4's larger checkpoints (use_bidirectional_attention "vision"): an image's tokens
attend to each other both ways in the sliding layers and causally in the full ones
(transformers' `create_masks_for_vision_model`); og's tokens with one and two images against
transformers', mutants of the layers the image blocks reach, and the graph ops per EP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mobius_genai import package
from mobius_genai.build import build
from mobius_genai.models import causal_lm
from tests._gemma4_vision import (
    KEPT_SIZES,
    image_inputs,
    image_tokens,
    og_image_inputs,
    og_prefill_logits,
    prefill_logits,
    random_pixels,
    reference_inputs,
    write_gemma4_checkpoint,
)
from tests._hf import generated_tokens
from tests._ort import assert_only_the_decoder_fuses_gqa, model_ops, og_greedy

TOLERANCE = 1e-4
#: float16 graphs against transformers' float32 logits (up to ~8): the causal checkpoint's
#: cuda graphs are ~0.18 off too; the image blocks move the logits by ~6.6.
F16_TOLERANCE = 0.25
#: The tiny checkpoint's layers: one sliding (window 16), then two full.
SLIDING, FULL = 1, 2


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory) -> tuple:
    """(model, folder): the tiny Gemma 4 checkpoint with use_bidirectional_attention
    "vision"."""
    folder = tmp_path_factory.mktemp("gemma4-both-ways")
    return write_gemma4_checkpoint(folder, use_bidirectional_attention="vision"), folder


@pytest.fixture(scope="module")
def both_ways_bundle(both_ways, tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma4-both-ways-bundle") / "bundle"
    return package(both_ways[1], "cpu", out, quiet=True, smoke_test=False)


@pytest.mark.parametrize("sizes", [[KEPT_SIZES[0]], [KEPT_SIZES[1], KEPT_SIZES[2]]])
def test_og_tokens_with_images_equal_transformers(both_ways, both_ways_bundle, tmp_path, sizes):
    """One image, and two of different sizes, through og's gemma4 pipeline: the prefill
    logits are transformers' (fp32) and og's greedy tokens equal transformers'; the image
    blocks matter (transformers' causal logits are far off)."""
    model, _ = both_ways
    pixels = [random_pixels(*size, seed=i) for i, size in enumerate(sizes)]
    og_model, inputs = og_image_inputs(both_ways_bundle, tmp_path, pixels)
    ids = inputs["input_ids"].as_numpy().astype(np.int64)
    assert (ids == model.config.image_token_id).sum() == sum(map(image_tokens, pixels))
    ours = og_prefill_logits(og_model, inputs)
    with torch.no_grad():
        expected = model(**reference_inputs(model, ids, pixels)).logits.numpy()
        causal = model(**reference_inputs(model, ids, pixels, blocks=False)).logits.numpy()
    # every position of a 3-layer prefill over ~80-150 tokens (as the causal bundle's test)
    np.testing.assert_allclose(ours, expected, atol=2 * TOLERANCE, rtol=0)
    assert np.abs(ours - causal).max() > 100 * TOLERANCE
    reference = reference_inputs(model, ids, pixels)
    theirs = generated_tokens(model, reference.pop("input_ids"), 6, **reference)
    assert og_greedy(og_model, inputs, 6) == theirs


def _two_images(model, pixels: list[np.ndarray]) -> np.ndarray:
    """A prompt with the image tokens of two images, text around and between them."""
    image = [model.config.image_token_id]
    first, second = (image * image_tokens(each) for each in pixels)
    return np.array([[2, 5, *first, 7, 5, *second, 8]], np.int64)


def _causal(self, layer: int) -> bool:
    return False


@pytest.mark.parametrize(
    ("mutant", "named"),
    [
        (None, "as built"),
        (_causal, "image tokens causal"),
        (causal_lm.TextModel._image_blocks_in, "image blocks in every layer (Gemma 3's)"),
    ],
)
def test_mutants_of_the_layers_the_image_blocks_reach_fail(both_ways, monkeypatch, mutant, named):
    """The decoder as built holds 1e-4 of transformers' prefill logits with two images; image
    tokens attending causally, or both ways in the full layers too, move them past it."""
    model, folder = both_ways
    if mutant is not None:
        monkeypatch.setattr(causal_lm.PerLayerTextModel, "_image_blocks_in", mutant)
    pixels = [random_pixels(*KEPT_SIZES[1]), random_pixels(*KEPT_SIZES[2], seed=1)]
    ids = _two_images(model, pixels)
    with torch.no_grad():
        expected = model(**reference_inputs(model, ids, pixels)).logits.numpy()
    built = build(folder, "cpu", "fp32", progress=False)
    error = float(np.abs(prefill_logits(built, ids, image_inputs(pixels)) - expected).max())
    assert (error < TOLERANCE) == (mutant is None), (named, error)
    if mutant is not None:
        assert error > 100 * TOLERANCE, (named, error)


def test_the_cuda_decoder_runs_on_the_cpu_kernel_like_transformers(both_ways):
    """cuda's float16 graphs (the sliding layer's GroupQueryAttention with causal=0 and the
    image-block bias) on onnxruntime's CPU kernels: the prefill logits of a prompt with two
    images hold float16's tolerance of transformers', far from the causal logits."""
    model, folder = both_ways
    built = build(folder, "cuda", progress=False)
    assert _gqa(built["decoder"], causal=0, bias=True) == SLIDING
    pixels = [random_pixels(*KEPT_SIZES[1]), random_pixels(*KEPT_SIZES[2], seed=1)]
    ids = _two_images(model, pixels)
    logits = prefill_logits(built, ids, image_inputs(pixels))
    with torch.no_grad():
        expected = model(**reference_inputs(model, ids, pixels)).logits.numpy()
        causal = model(**reference_inputs(model, ids, pixels, blocks=False)).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=F16_TOLERANCE, rtol=0)
    assert np.abs(logits - causal).max() > 10 * F16_TOLERANCE  # the image blocks matter


def _gqa(decoder, causal: int, bias: bool) -> int:
    """The decoder's GroupQueryAttention nodes with `causal` and with or without a bias."""
    return sum(
        node.op_type == "GroupQueryAttention"
        and node.attributes.get_int("causal", 1) == causal
        and (len(node.inputs) > 10 and node.inputs[10] is not None) == bias
        for node in decoder.graph.all_nodes()
    )


@pytest.mark.parametrize(
    ("ep", "image_gqa"), [("cpu", True), ("cuda", True), ("dml", False), ("onnx-standard", False)]
)
def test_graph_ops_per_ep(both_ways, ep, image_gqa):
    """Where the EP's GroupQueryAttention takes attention_bias, the sliding layer's is
    causal=0 with the image-block bias (its window in the bias, GQA's own off) and the full
    layers' stay causal GQA; dml keeps ONNX Attention for the sliding layer; onnx-standard
    keeps Attention everywhere."""
    _, folder = both_ways
    built = build(folder, ep, load_weights=False, progress=False)
    assert_only_the_decoder_fuses_gqa(built, ep)
    decoder = built["decoder"]
    assert _gqa(decoder, causal=0, bias=True) == (SLIDING if image_gqa else 0)
    any_gqa = ep != "onnx-standard"
    assert _gqa(decoder, causal=1, bias=False) == (FULL if any_gqa else 0)
    assert (("", "Attention") in model_ops(decoder)) == (not image_gqa)
    for node in decoder.graph.all_nodes():
        if node.op_type == "GroupQueryAttention" and node.attributes.get_int("causal", 1) == 0:
            assert node.attributes.get_int("local_window_size", -1) == -1
