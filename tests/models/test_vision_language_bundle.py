"""A Gemma 3 vision-language bundle: packaged, run by onnxruntime-genai with an image, and its
greedy tokens equal transformers' (the image is at the processor's size, so no resize)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from mobius_genai.ep import get_ep
from mobius_genai.packager import package
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import png_bytes
from tests._ort import og_greedy, smoke_image_prompt
from tests._vlm import SIZE, transformers_tokens

og = pytest.importorskip("onnxruntime_genai")


def test_onnxruntime_genai_greedy_tokens_with_an_image_equal_transformers(
    gemma3_checkpoint, gemma3_bundle, tmp_path
):
    model, _ = gemma3_checkpoint
    bundle = gemma3_bundle
    config = json.loads((bundle / "genai_config.json").read_text())
    assert config["model"]["type"] == "gemma3"
    assert {"vision", "embedding", "decoder"} <= set(config["model"])
    image_path = tmp_path / "image.png"
    pixels = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    image_path.write_bytes(png_bytes(pixels))

    og_model = og.Model(str(bundle))
    processor = og_model.create_multimodal_processor()
    inputs = processor("<start_of_image>", images=og.Images.open(str(image_path)))
    input_ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    og_pixels = inputs["pixel_values"].as_numpy()
    hf_pixels = ((pixels / 255 - 0.5) / 0.5).astype(np.float32).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(og_pixels, hf_pixels, atol=1e-5, rtol=0)

    assert og_greedy(og_model, inputs, 6) == transformers_tokens(model, input_ids, pixels, 6)


def test_smoke_test_generates_with_an_image_at_the_processors_size_like_transformers(
    gemma3_checkpoint, gemma3_bundle
):
    model, _ = gemma3_checkpoint
    bundle = gemma3_bundle
    result = smoke_test(bundle, get_ep("cpu"))
    assert result.ran
    assert f"with a {SIZE}x{SIZE} image" in result.note
    assert result.note.endswith("same as a plain onnxruntime loop")
    # the same prompt and image through og's processor give the ids transformers continues
    pixels, input_ids = smoke_image_prompt(bundle, "<start_of_image>", SIZE)
    expected = transformers_tokens(model, input_ids, pixels, len(result.tokens))
    assert list(result.tokens) == expected


def test_package_smoke_tests_a_vision_language_bundle_with_an_image(
    gemma3_checkpoint, tmp_path, capfd
):
    package(gemma3_checkpoint[1], "cpu", tmp_path / "bundle", smoke_test=True)
    err = capfd.readouterr().err
    assert f"with a {SIZE}x{SIZE} image" in err
    # each graph's save reports its progress (one line each where stderr is not a terminal)
    saved = re.findall(r"saving (\S+) \(graph (\d) of 3, (\w+)\): (\d+) of (\d+) tensors", err)
    assert [(name, index, role) for name, index, role, _, _ in saved] == [
        ("vision.onnx", "1", "vision"),
        ("embedding.onnx", "2", "embedding"),
        ("decoder.onnx", "3", "decoder"),
    ]
    assert all(done == total != "0" for *_, done, total in saved)
