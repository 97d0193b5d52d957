"""A Qwen3-VL bundle through onnxruntime-genai 0.18: its genai_config (model.type qwen3_vl,
decoder.hidden_size the DeepStack-wide embeddings og sizes image_features and inputs_embeds
by), og's processor gives transformers' patches (RGB, no channel swap), and og's greedy tokens
with one image and with two equal transformers'."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.errors import BundleError, OptionError
from mobius_genai.packager import package
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import png_bytes
from mobius_genai.runtime.video import video_inputs
from tests._hf import generated_tokens
from tests._ort import assert_validate_names, og_greedy, saved_ops, smoke_image_prompt
from tests._qwen3_vl import DEEPSTACK
from tests._qwen_vl import TEXT_HIDDEN, patches, temporal_patches, transformers_tokens

og = pytest.importorskip("onnxruntime_genai")

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
WIDTH = TEXT_HIDDEN * (1 + len(DEEPSTACK))


@pytest.fixture(scope="module")
def checkpoint(qwen3_vl_checkpoint) -> tuple[torch.nn.Module, Path]:
    return qwen3_vl_checkpoint


@pytest.fixture(scope="module")
def bundle(qwen3_vl_bundle) -> Path:
    return qwen3_vl_bundle


def _og_inputs(bundle: Path, prompt: str, tmp_path: Path, images: list[np.ndarray]):
    """(og.Model, its processor's inputs, input_ids as torch) for `prompt` with `images`
    written as PNG files."""
    paths = []
    for index, pixels in enumerate(images):
        paths.append(str(tmp_path / f"image{index}.png"))
        Path(paths[-1]).write_bytes(png_bytes(pixels))
    og_model = og.Model(str(bundle))
    inputs = og_model.create_multimodal_processor()(prompt, images=og.Images.open(*paths))
    return og_model, inputs, torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))


def test_genai_config_is_what_onnxruntime_genai_reads_for_qwen3_vl(checkpoint, bundle):
    model, _ = checkpoint
    config = json.loads((bundle / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen3_vl"
    assert config["decoder"]["hidden_size"] == WIDTH
    ids = model.config
    assert (config["image_token_id"], config["vision_start_token_id"]) == (
        ids.image_token_id,
        ids.vision_start_token_id,
    )
    vision = config["vision"]
    assert vision["inputs"] == {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}
    assert (vision["spatial_merge_size"], vision["patch_size"]) == (2, 4)
    assert "window_size" not in vision
    processor = json.loads((bundle / vision["config_filename"]).read_text())["processor"]
    operations = [t["operation"] for t in processor["transforms"]]
    assert [op["type"] for op in operations] == [
        "DecodeImage",
        "Resize",
        "Rescale",
        "Normalize",
        "PatchImage",
    ]
    assert operations[0]["attrs"] == {"color_space": "RGB"}  # no ConvertRGB (it gives BGR)


def test_onnxruntime_genai_greedy_tokens_with_an_image_equal_transformers(
    checkpoint, bundle, tmp_path
):
    model, _ = checkpoint
    pixels = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    og_model, inputs, input_ids = _og_inputs(bundle, f"{PLACEHOLDER} Describe.", tmp_path, [pixels])
    expected_values, expected_grid = patches(pixels)  # channel order: transformers' RGB
    np.testing.assert_allclose(inputs["pixel_values"].as_numpy(), expected_values, atol=1e-5)
    np.testing.assert_array_equal(inputs["image_grid_thw"].as_numpy(), expected_grid)
    assert int((input_ids == model.config.image_token_id).sum()) == 5 * 7
    assert og_greedy(og_model, inputs, 6) == transformers_tokens(model, input_ids, pixels, 6)


def test_onnxruntime_genai_cannot_feed_a_video(checkpoint, bundle, tmp_path):
    """og 0.18 has no video input: no Videos class, a processor that reads `images` and
    `audios` (other keywords dropped) and expands every vision span as an image, so a video
    placeholder without an image is refused and with one becomes that image's tokens. og picks
    the processor by model.type alone (qwen3_vl), so its builder's bundles fare the same."""
    model, _ = checkpoint
    assert [name for name in dir(og) if "video" in name.lower()] == []
    prompt = "<|vision_start|><|video_pad|><|vision_end|> Describe."
    processor = og.Model(str(bundle)).create_multimodal_processor()
    frame = tmp_path / "frame.png"
    frame.write_bytes(png_bytes(np.zeros((40, 56, 3), np.uint8)))
    for videos in ({}, {"videos": [str(frame)]}):
        with pytest.raises(RuntimeError, match="1 vision_start tokens but received 0 images"):
            processor(prompt, **videos)
    _, _, input_ids = _og_inputs(bundle, prompt, tmp_path, [np.zeros((40, 56, 3), np.uint8)])
    assert int((input_ids == model.config.video_token_id).sum()) == 0
    assert int((input_ids == model.config.image_token_id).sum()) == 5 * 7


@pytest.mark.parametrize(("count", "indices"), [(4, [0, 3, 6, 9]), (3, None)])
def test_video_inputs_generate_transformers_video_tokens(checkpoint, bundle, count, indices):
    """video_inputs: each temporal patch (two frames; an odd last frame repeated, as
    transformers pads) as one image of og.NamedTensors after Qwen3VLProcessor's timestamp.
    The patches are transformers' video processor's, and og's greedy tokens transformers'."""
    from transformers import Qwen3VLProcessor

    model, _ = checkpoint
    config = model.config
    frames = np.random.default_rng(count).integers(0, 256, (count, 40, 56, 3), dtype=np.uint8)
    og_model = og.Model(str(bundle))
    inputs = video_inputs(bundle, og_model, frames, " Describe.", 2.0, indices)
    padded = np.concatenate([frames, frames[-1:]]) if count % 2 else frames
    values, grid = temporal_patches(padded)
    np.testing.assert_allclose(inputs["pixel_values"].as_numpy(), values, atol=1e-5)
    ids = inputs["input_ids"].as_numpy()
    times = Qwen3VLProcessor._calculate_timestamps(None, indices or list(range(count)), 2.0, 2)
    text = og.Tokenizer(og_model).decode(ids[0])
    assert [f"{t:.1f}" for t in times] == re.findall(r"<(\d+\.\d) seconds>", text)
    video_ids = torch.from_numpy(ids.astype(np.int64))
    video_ids[video_ids == config.image_token_id] = config.video_token_id
    reference = generated_tokens(
        model,
        video_ids,
        6,
        pixel_values_videos=torch.from_numpy(values),
        video_grid_thw=torch.from_numpy(grid),
        mm_token_type_ids=(video_ids == config.video_token_id).int() * 2,
    )
    assert og_greedy(og_model, inputs, 6) == reference


@pytest.mark.parametrize(
    ("frames", "indices", "message"),
    [
        (np.zeros((2, 40, 56, 3), np.float32), None, "accepted: uint8 .frames, height"),
        (np.zeros((2, 40, 50, 3), np.uint8), None, "50x40; accepted: width and height"),
        (np.zeros((2, 40, 56, 3), np.uint8), [0], "1 frame indices for 2 video frames"),
    ],
)
def test_video_inputs_name_bad_frames(bundle, frames, indices, message):
    with pytest.raises(BundleError, match=message):
        video_inputs(bundle, og.Model(str(bundle)), frames, "", 2.0, indices)


@pytest.mark.parametrize("prompt", [" <|image_pad|> Describe.", f" {PLACEHOLDER} Describe."])
def test_video_inputs_refuse_image_tokens_in_the_prompt(bundle, prompt):
    """An image token or placeholder in the prompt outnumbers the frames' features: refused
    before og (which failed generating, "Gather ... out of bounds")."""
    frames = np.zeros((2, 40, 56, 3), np.uint8)
    with pytest.raises(OptionError, match=r"video_inputs .*, or a prompt without it$"):
        video_inputs(bundle, og.Model(str(bundle)), frames, prompt, 2.0)


def test_video_inputs_refuse_a_bundle_of_another_type(bundle, tmp_path):
    """The patch-per-image form is Qwen3-VL's (a timestamp before each temporal patch);
    Qwen2.5-VL's video is one span whose temporal positions scale by seconds per patch."""
    config = json.loads((bundle / "genai_config.json").read_text())
    config["model"]["type"] = "qwen2_5_vl"
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    frames = np.zeros((2, 40, 56, 3), np.uint8)
    with pytest.raises(BundleError, match="model.type 'qwen2_5_vl' takes no video here"):
        video_inputs(tmp_path, og.Model(str(bundle)), frames, "", 2.0)


def test_two_images_of_different_sizes_equal_transformers(checkpoint, bundle, tmp_path):
    """og runs the vision graph once per image ([1, 3] grid) and concatenates the wide rows."""
    model, _ = checkpoint
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for size in ((40, 56), (32, 48))]
    prompt = f"{PLACEHOLDER} and {PLACEHOLDER} Compare."
    og_model, inputs, input_ids = _og_inputs(bundle, prompt, tmp_path, images)
    assert og_greedy(og_model, inputs, 6) == transformers_tokens(model, input_ids, images, 6)


def test_smoke_test_generates_with_an_image_like_transformers(checkpoint, bundle):
    model, _ = checkpoint
    result = smoke_test(bundle, get_ep("cpu"))
    assert result.ran
    assert "with a 32x32 image" in result.note
    pixels, input_ids = smoke_image_prompt(bundle, PLACEHOLDER, 32)
    assert list(result.tokens) == transformers_tokens(model, input_ids, pixels, len(result.tokens))


def test_run_with_two_images_streams_what_transformers_generates(
    checkpoint, bundle, tmp_path, capsys
):
    model, _ = checkpoint
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (32, 40, 3), dtype=np.uint8) for _ in range(2)]
    prompt = f"{PLACEHOLDER} {PLACEHOLDER} Compare."  # as `run` joins the placeholders
    og_model, _, input_ids = _og_inputs(bundle, prompt, tmp_path, images)
    paths = [str(tmp_path / f"image{index}.png") for index in range(2)]
    command = ["run", str(bundle), "--image", paths[0], "--image", paths[1]]
    assert main([*command, "--prompt", "Compare.", "--raw", "--max-new-tokens", "5"]) == 0
    text = capsys.readouterr().out
    stream = og.Tokenizer(og_model).create_stream()  # as `run` streams: whole characters
    tokens = transformers_tokens(model, input_ids, images, 5)
    assert text == "".join(stream.decode(t) for t in tokens) + "\n"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            lambda model: model["decoder"].update(hidden_size=TEXT_HIDDEN),
            f"model.decoder.hidden_size: {TEXT_HIDDEN} but graph input 'inputs_embeds' is "
            f"{WIDTH} wide",
        ),
        (
            lambda model: model["vision"].pop("patch_size"),
            "model.vision.patch_size: required field is missing",
        ),
    ],
)
def test_validate_names_what_onnxruntime_genai_would_size_wrong(bundle, tmp_path, change, named):
    assert_validate_names(bundle, tmp_path, change, named)


def test_qwen3_vl_moe_bundle_generates_transformers_tokens_with_an_image(
    qwen3_vl_moe_checkpoint, tmp_path, capfd
):
    """Qwen3-VL-MoE (experts in the hub's layout) packaged with its smoke test: og's type
    qwen3_vl, the MoE decoder, og's greedy tokens with an image equal transformers'."""
    model, checkpoint = qwen3_vl_moe_checkpoint
    bundle = package(checkpoint, "cpu", tmp_path / "bundle")
    assert "with a 32x32 image" in capfd.readouterr().err  # the smoke test ran with an image
    config = json.loads((bundle / "genai_config.json").read_text())["model"]
    assert (config["type"], config["decoder"]["hidden_size"]) == ("qwen3_vl", WIDTH)
    pixels = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    og_model, inputs, input_ids = _og_inputs(bundle, f"{PLACEHOLDER} Describe.", tmp_path, [pixels])
    assert og_greedy(og_model, inputs, 6) == transformers_tokens(model, input_ids, pixels, 6)


def test_int4_quantizes_the_moe_decoder_and_keeps_the_tower_float(
    qwen3_vl_moe_checkpoint, tmp_path, capfd
):
    bundle = package(qwen3_vl_moe_checkpoint[1], "cpu", tmp_path / "bundle", precision="int4")
    ops = {
        name: saved_ops(bundle / name) for name in ("vision.onnx", "embedding.onnx", "decoder.onnx")
    }
    assert ("com.microsoft", "MatMulNBits") in ops["decoder.onnx"]
    assert ("com.microsoft", "QMoE") in ops["decoder.onnx"]
    assert ("com.microsoft", "MatMulNBits") not in ops["vision.onnx"] | ops["embedding.onnx"]
    assert "with a 32x32 image" in capfd.readouterr().err  # the smoke test ran with an image
