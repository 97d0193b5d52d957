"""A Qwen2.5-VL bundle: genai_config and processor config as onnxruntime-genai 0.18 reads them,
og's processor gives transformers' patches, and og's greedy tokens with an image (already at
the processor's size) equal transformers'."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.packager import package
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import png_bytes
from tests._ort import assert_validate_names, og_greedy, saved_ops, smoke_image_prompt
from tests._qwen_vl import MIN_PIXELS, patches, transformers_tokens

og = pytest.importorskip("onnxruntime_genai")

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def checkpoint(qwen2_5_vl_checkpoint) -> tuple[torch.nn.Module, Path]:
    return qwen2_5_vl_checkpoint


@pytest.fixture(scope="module")
def bundle(qwen2_5_vl_bundle) -> Path:
    return qwen2_5_vl_bundle


def test_genai_config_is_what_onnxruntime_genai_reads_for_qwen2_5_vl(checkpoint, bundle):
    model, _ = checkpoint
    config = json.loads((bundle / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen2_5_vl"
    ids = model.config
    assert (config["image_token_id"], config["video_token_id"]) == (
        ids.image_token_id,
        ids.video_token_id,
    )
    assert config["vision_start_token_id"] == ids.vision_start_token_id
    vision = config["vision"]
    assert vision["inputs"] == {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}
    assert (vision["spatial_merge_size"], vision["patch_size"], vision["window_size"]) == (2, 4, 16)
    assert vision["tokens_per_second"] == 4.0
    assert config["decoder"]["inputs"]["position_ids"] == "position_ids"
    processor = json.loads((bundle / vision["config_filename"]).read_text())["processor"]
    kinds = [t["operation"]["type"] for t in processor["transforms"]]
    assert kinds == ["DecodeImage", "Resize", "Rescale", "Normalize", "PatchImage"]
    resize = processor["transforms"][1]["operation"]["attrs"]
    assert (resize["min_pixels"], resize["max_pixels"], resize["smart_resize"]) == (
        MIN_PIXELS,
        256 * 256,
        1,
    )


def test_onnxruntime_genai_greedy_tokens_with_an_image_equal_transformers(
    checkpoint, bundle, tmp_path
):
    assert_og_greedy_tokens_equal_transformers(checkpoint[0], bundle, tmp_path)


def assert_og_greedy_tokens_equal_transformers(model, bundle: Path, tmp_path: Path) -> None:
    """og's multimodal processor on a 40 x 56 PNG gives transformers' patches and grid, and
    og.Generator's greedy tokens after them equal transformers'."""
    pixels = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    image_path = tmp_path / "image.png"
    image_path.write_bytes(png_bytes(pixels))
    og_model = og.Model(str(bundle))
    processor = og_model.create_multimodal_processor()
    inputs = processor(f"{PLACEHOLDER} Describe.", images=og.Images.open(str(image_path)))
    expected_values, expected_grid = patches(pixels)
    np.testing.assert_allclose(inputs["pixel_values"].as_numpy(), expected_values, atol=1e-5)
    np.testing.assert_array_equal(inputs["image_grid_thw"].as_numpy(), expected_grid)
    input_ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    assert int((input_ids == model.config.image_token_id).sum()) == 5 * 7

    assert og_greedy(og_model, inputs, 6) == transformers_tokens(model, input_ids, pixels, 6)


def test_smoke_test_generates_with_an_image_like_transformers(checkpoint, bundle):
    model, _ = checkpoint
    result = smoke_test(bundle, get_ep("cpu"))
    assert result.ran
    assert "with a 32x32 image" in result.note
    assert result.note.endswith("same as a plain onnxruntime loop")
    pixels, input_ids = smoke_image_prompt(bundle, PLACEHOLDER, 32)
    assert list(result.tokens) == transformers_tokens(model, input_ids, pixels, len(result.tokens))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            lambda model: model.update(type="gemma3"),
            "graph input 'position_ids' is [3, batch, seq] but onnxruntime-genai feeds "
            "model.type 'gemma3' positions [batch, seq]",
        ),
        (
            lambda model: model.pop("vision_start_token_id"),
            "model.vision_start_token_id: required field is missing",
        ),
        (
            lambda model: model["vision"].pop("patch_size"),
            "model.vision.patch_size: required field is missing",
        ),
        (
            lambda model: model["vision"]["inputs"].pop("image_grid_thw"),
            "graph input 'image_grid_thw' is not fed",
        ),
    ],
)
def test_validate_names_what_onnxruntime_genai_would_feed_wrong(bundle, tmp_path, change, named):
    assert_validate_names(bundle, tmp_path, change, named)


def test_two_images_of_different_sizes_run_image_by_image_like_transformers(
    checkpoint, bundle, tmp_path
):
    """image_grid_thw is [1, 3] in the graph, so og runs it once per image and concatenates."""
    model, _ = checkpoint
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for size in ((40, 56), (32, 48))]
    paths = []
    for index, pixels in enumerate(images):
        paths.append(tmp_path / f"image{index}.png")
        paths[-1].write_bytes(png_bytes(pixels))
    og_model = og.Model(str(bundle))
    inputs = og_model.create_multimodal_processor()(
        f"{PLACEHOLDER} and {PLACEHOLDER} Compare.", images=og.Images.open(*map(str, paths))
    )
    input_ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    assert og_greedy(og_model, inputs, 6) == transformers_tokens(model, input_ids, images, 6)


def test_run_with_an_image_streams_what_transformers_generates(
    checkpoint, bundle, tmp_path, capsys
):
    """The prompt gets Qwen's image placeholder in front; greedy, so the text is transformers'."""
    model, _ = checkpoint
    pixels = np.random.default_rng(1).integers(0, 256, (32, 40, 3), dtype=np.uint8)
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(pixels))
    command = ["run", str(bundle), "--image", str(path), "--prompt", "Describe it."]
    assert main([*command, "--raw", "--max-new-tokens", "5"]) == 0
    text = capsys.readouterr().out
    og_model = og.Model(str(bundle))
    inputs = og_model.create_multimodal_processor()(
        f"{PLACEHOLDER} Describe it.", images=og.Images.open(str(path))
    )
    input_ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    stream = og.Tokenizer(og_model).create_stream()  # as `run` streams: whole characters
    expected = "".join(stream.decode(t) for t in transformers_tokens(model, input_ids, pixels, 5))
    assert text == expected + "\n"


@pytest.mark.parametrize(
    "prompt", ["<|image_pad|> Describe it.", f"{PLACEHOLDER} <|image_pad|> Describe it."]
)
def test_run_refuses_the_image_token_outside_a_placeholder_in_one_line(
    bundle, tmp_path, capsys, prompt
):
    """`<|image_pad|>` written out beside an image is one more image token than the image has
    features: refused before og, which fails it in its session run ("Gather ... out of
    bounds")."""
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(np.zeros((32, 40, 3), np.uint8)))
    capsys.readouterr()
    assert main(["run", str(bundle), "--image", str(path), "--prompt", prompt]) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Gather" not in captured.err, captured.err
    assert "holds <|image_pad|>, the token og fills with an image's features" in captured.err
    assert f"accepted: {PLACEHOLDER} to place an image" in captured.err


def test_int4_quantizes_the_decoder_and_keeps_the_vision_tower_float(checkpoint, tmp_path, capfd):
    bundle = package(checkpoint[1], "cpu", tmp_path / "bundle", precision="int4")
    ops = {
        name: saved_ops(bundle / name) for name in ("vision.onnx", "embedding.onnx", "decoder.onnx")
    }
    assert ("com.microsoft", "MatMulNBits") in ops["decoder.onnx"]
    assert ("", "MatMul") not in ops["decoder.onnx"]
    assert ("com.microsoft", "MatMulNBits") not in ops["vision.onnx"] | ops["embedding.onnx"]
    assert "with a 32x32 image" in capfd.readouterr().err  # the smoke test ran with an image
