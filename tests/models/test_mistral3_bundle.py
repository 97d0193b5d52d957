"""A Mistral 3 bundle: genai_config and processor config as onnxruntime-genai 0.18 reads them,
og's processor gives transformers' pixel values (RGB) and image tokens, and og's greedy tokens
with an image (already at the processor's size) equal transformers'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import png_bytes
from tests._hf import generated_tokens
from tests._mistral3 import (
    LONGEST_EDGE,
    TOKEN_PIXELS,
    image_tokens,
    pixel_values,
    special_ids,
    transformers_tokens,
)
from tests._ort import assert_validate_names, og_greedy, smoke_image_prompt

og = pytest.importorskip("onnxruntime_genai")

PLACEHOLDER = "[IMG]"


@pytest.fixture(scope="module")
def checkpoint(mistral3_checkpoint) -> tuple[torch.nn.Module, Path]:
    return mistral3_checkpoint


@pytest.fixture(scope="module")
def bundle(mistral3_bundle) -> Path:
    return mistral3_bundle


def _processor_inputs(bundle: Path, prompt: str, *paths: Path):
    og_model = og.Model(str(bundle))
    processor = og_model.create_multimodal_processor()
    return og_model, processor(prompt, images=og.Images.open(*map(str, paths)))


def _write_image(tmp_path: Path, pixels: np.ndarray, name: str = "image.png") -> Path:
    path = tmp_path / name
    path.write_bytes(png_bytes(pixels))
    return path


def test_genai_config_is_what_onnxruntime_genai_reads_for_mistral3(bundle):
    config = json.loads((bundle / "genai_config.json").read_text())["model"]
    assert config["type"] == "mistral3"
    vision = config["vision"]
    assert vision["inputs"] == {"pixel_values": "pixel_values"}
    assert (vision["patch_size"], vision["spatial_merge_size"]) == (4, 2)
    assert "position_ids" not in config["decoder"]["inputs"]  # 1-D positions og computes
    processor = json.loads((bundle / vision["config_filename"]).read_text())["processor"]
    kinds = [t["operation"]["type"] for t in processor["transforms"]]
    # no ConvertRGB (it swaps to BGR); og reads image_sizes from PixtralImageSizes, last
    assert kinds == [
        "DecodeImage",
        "Resize",
        "Rescale",
        "Normalize",
        "Permute3D",
        "PixtralImageSizes",
    ]
    resize = processor["transforms"][1]["operation"]["attrs"]
    assert resize["max_pixels"] == LONGEST_EDGE**2
    assert (resize["patch_size"], resize["merge_size"], resize["smart_resize"]) == (4, 2, 1)


@pytest.mark.parametrize("size", [(24, 40), (48, 16)])
def test_onnxruntime_genai_greedy_tokens_with_an_image_equal_transformers(
    checkpoint, bundle, tmp_path, size
):
    """og's processor gives transformers' pixel values and expands [IMG] into its rows of image
    tokens, [IMG_BREAK] between rows and [IMG_END] after the last; og's tokens equal
    transformers'."""
    model, folder = checkpoint
    pixels = np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)
    prompt = f"[INST]{PLACEHOLDER} Describe.[/INST]"
    og_model, inputs = _processor_inputs(bundle, prompt, _write_image(tmp_path, pixels))
    np.testing.assert_allclose(inputs["pixel_values"].as_numpy(), pixel_values(pixels), atol=1e-5)
    np.testing.assert_array_equal(inputs["image_sizes"].as_numpy(), [list(size)])
    ids = inputs["input_ids"].as_numpy().reshape(-1).tolist()
    expected = image_tokens(*size, special_ids(folder))
    start = ids.index(expected[0])
    assert ids[start : start + len(expected)] == expected
    assert ids.count(expected[0]) == size[0] * size[1] // TOKEN_PIXELS**2
    input_ids = torch.tensor([ids])
    assert og_greedy(og_model, inputs, 6) == transformers_tokens(model, input_ids, pixels, 6)


def test_convert_rgb_would_feed_the_tower_bgr(bundle, tmp_path):
    """The fact behind the processor config: onnxruntime-extensions' ConvertRGB after an RGB
    DecodeImage reverses the channels, while transformers' processor keeps RGB."""
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    path = copy / "processor_config.json"
    document = json.loads(path.read_text())
    convert = {"operation": {"name": "convert_to_rgb", "type": "ConvertRGB"}}
    document["processor"]["transforms"].insert(1, convert)
    path.write_text(json.dumps(document))
    pixels = np.random.default_rng(2).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    _, inputs = _processor_inputs(copy, PLACEHOLDER, _write_image(tmp_path, pixels))
    values = inputs["pixel_values"].as_numpy()
    np.testing.assert_allclose(values, pixel_values(pixels[..., ::-1]), atol=1e-5)
    assert np.abs(values - pixel_values(pixels)).max() > 1


def test_two_images_of_different_sizes_run_image_by_image_like_transformers(
    checkpoint, bundle, tmp_path
):
    """og pads both into one pixel_values, slices each back by image_sizes and runs the vision
    graph once per image. (og 0.18's processor pads every image to the tallest one's size, so
    a tallest image narrower than another fails inside og: "PixtralVisionState: image 0 has
    w_i=40 which is out of valid range".)"""
    model, _ = checkpoint
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for size in ((16, 24), (32, 40))]
    paths = [_write_image(tmp_path, pixels, f"image{i}.png") for i, pixels in enumerate(images)]
    prompt = f"[INST]{PLACEHOLDER} and {PLACEHOLDER} Compare.[/INST]"
    og_model, inputs = _processor_inputs(bundle, prompt, *paths)
    input_ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    padded = np.zeros((2, 3, 32, 40), np.float32)  # as transformers' processor pads
    for index, pixels in enumerate(images):
        height, width, _ = pixels.shape
        padded[index, :, :height, :width] = pixel_values(pixels)[0]
    reference = generated_tokens(
        model,
        input_ids,
        6,
        pixel_values=torch.from_numpy(padded),
        image_sizes=torch.tensor([list(pixels.shape[:2]) for pixels in images]),
    )
    assert og_greedy(og_model, inputs, 6) == reference


def test_smoke_test_generates_with_an_image_like_transformers(checkpoint, bundle):
    model, _ = checkpoint
    result = smoke_test(bundle, get_ep("cpu"))
    assert result.ran
    side = 2 * TOKEN_PIXELS
    assert f"with a {side}x{side} image" in result.note
    assert result.note.endswith("same as a plain onnxruntime loop")
    pixels, input_ids = smoke_image_prompt(bundle, PLACEHOLDER, side)
    assert list(result.tokens) == transformers_tokens(model, input_ids, pixels, len(result.tokens))


def test_run_with_an_image_streams_what_transformers_generates(
    checkpoint, bundle, tmp_path, capsys
):
    """The prompt gets Mistral's [IMG] in front; greedy, so the text is transformers'."""
    model, _ = checkpoint
    pixels = np.random.default_rng(1).integers(0, 256, (32, 24, 3), dtype=np.uint8)
    path = _write_image(tmp_path, pixels, "photo.png")
    command = ["run", str(bundle), "--image", str(path), "--prompt", "Describe it."]
    assert main([*command, "--raw", "--max-new-tokens", "5"]) == 0
    text = capsys.readouterr().out
    og_model, inputs = _processor_inputs(bundle, f"{PLACEHOLDER} Describe it.", path)
    input_ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    stream = og.Tokenizer(og_model).create_stream()  # as `run` streams: whole characters
    expected = "".join(stream.decode(t) for t in transformers_tokens(model, input_ids, pixels, 5))
    assert text == expected + "\n"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            lambda model: model["vision"].pop("patch_size"),
            "model.vision.patch_size: required field is missing",
        ),
        (
            lambda model: model["vision"].pop("spatial_merge_size"),
            "model.vision.spatial_merge_size: required field is missing",
        ),
        (lambda model: model.pop("embedding"), "model.embedding: required field is missing"),
    ],
)
def test_validate_names_what_onnxruntime_genai_would_miscount(bundle, tmp_path, change, named):
    assert_validate_names(bundle, tmp_path, change, named)
