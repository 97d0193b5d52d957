"""LFM2-VL: the SigLIP2 NaFlex tower and pixel-unshuffle projector, the embedding graph and
og's lfm2_vl pipeline against transformers (fp32, 1e-4), on images already at the size the
image processor keeps."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime_genai as og
import pytest
import torch
from safetensors.numpy import load_file, save_file

from mobius_genai.build import build
from mobius_genai.bundle.og_support import REWIND, bundle_og_limits
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.cli import main
from mobius_genai.components import siglip2
from mobius_genai.ep import get_ep
from mobius_genai.packager import package
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import png_bytes
from tests._hf import generated_tokens
from tests._lfm2_vl import (
    image_inputs,
    image_tokens,
    reference_features,
    tiny_lfm2_vl,
    transformers_tokens,
)
from tests._ort import og_greedy, package_sessions

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
#: (height, width) pixels: 4 x 6 patches (positions upsampled from the 4 x 4 grid), 8 x 4
#: (the grid's rows doubled, its columns kept), 2 x 10 (rows downsampled: the antialiased
#: weights), each cut into 2 x 2 blocks.
SIZES = ((16, 24), (32, 16), (8, 40))


def _pixels(height: int, width: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def lfm2_vl(tmp_path_factory):
    model = tiny_lfm2_vl()
    folder = tmp_path_factory.mktemp("lfm2_vl")
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module", params=EPS)
def sessions(request, lfm2_vl):
    return package_sessions(build(lfm2_vl[1], request.param, "fp32", progress=False))


@pytest.mark.parametrize("sizes", [[SIZES[0]], [SIZES[1]], [SIZES[2]], list(SIZES)])
def test_vision_graph_matches_transformers(lfm2_vl, sessions, sizes):
    """One image of each size, and the three in one run (one padded patch axis, each image's
    mask and patch grid)."""
    model, _ = lfm2_vl
    inputs = image_inputs([_pixels(*size) for size in sizes])
    ours = sessions["vision"].run(None, inputs)[0]
    expected = reference_features(model, inputs)
    assert ours.shape == (sum(image_tokens(_pixels(*size)) for size in sizes), 64)
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)


def test_embedding_graph_places_the_features_as_transformers_does(lfm2_vl, sessions):
    model, _ = lfm2_vl
    image = model.config.image_token_id
    inputs = image_inputs([_pixels(*SIZES[0])])
    features = reference_features(model, inputs)
    input_ids = np.array([[5, 6, *[image] * len(features), 7, 8]], np.int64)
    (embeds,) = sessions["embedding"].run(
        None, {"input_ids": input_ids, "image_features": features}
    )
    with torch.no_grad():
        expected = model.model.get_input_embeddings()(torch.from_numpy(input_ids))
        mask = torch.from_numpy(input_ids == image)[..., None].expand_as(expected)
        expected = expected.masked_scatter(mask, torch.from_numpy(features)).numpy()
    np.testing.assert_allclose(embeds, expected, atol=TOLERANCE, rtol=0)


def test_graph_ops_per_ep(lfm2_vl):
    """onnx-standard: every graph in standard ONNX (Attention with the padding mask, the
    unshuffle as Gather + Compress); cpu and cuda: the decoder's attention in
    GroupQueryAttention, its conv layers in CausalConvWithState with their states as graph
    inputs; the tower's attention stays standard Attention with the mask."""
    _, folder = lfm2_vl
    standard = build(folder, "onnx-standard", "fp32", load_weights=False)
    for key in ("vision", "embedding", "decoder"):
        assert {node.domain for node in standard[key].graph} == {""}, key
    vision_ops = {node.op_type for node in standard["vision"].graph}
    assert {"Attention", "Gather", "Compress", "LayerNormalization"} <= vision_ops
    cpu = build(folder, "cpu", "fp32", load_weights=False)
    decoder_ops = [node.op_type for node in cpu["decoder"].graph]
    assert decoder_ops.count("GroupQueryAttention") == 1  # one attention layer of three
    inputs = [value.name for value in cpu["decoder"].graph.inputs]
    assert "inputs_embeds" in inputs
    assert sum(name.startswith("past.") and name.endswith("conv") for name in inputs) == 2
    cuda = build(folder, "cuda", None, load_weights=False)  # fp16: the padding mask's -inf kept
    assert [node.op_type for node in cuda["vision"].graph].count("Attention") == 2
    decoder_ops = [node.op_type for node in cuda["decoder"].graph]
    assert (decoder_ops.count("GroupQueryAttention"), decoder_ops.count("CausalConvWithState")) == (
        1,
        2,
    )


class _ColumnOffsetFirst(siglip2.Lfm2VlProjector):
    """Joins each block's patches column offset first (each block transposed)."""

    def _block(self, op, top, left, cols):
        return op.Transpose(super()._block(op, top, left, cols), perm=[0, 1, 3, 2])


def test_parity_fails_with_the_unshuffle_order_wrong(lfm2_vl, monkeypatch):
    """A block's patches joined column offset first (the mutant transposes each block): the
    features move well past the tolerance."""
    model, folder = lfm2_vl
    inputs = image_inputs([_pixels(*SIZES[0])])
    expected = reference_features(model, inputs)
    monkeypatch.setattr(siglip2, "Lfm2VlProjector", _ColumnOffsetFirst)
    ours = package_sessions(build(folder, "default", "fp32", progress=False))["vision"]
    assert np.abs(ours.run(None, inputs)[0] - expected).max() > 10 * TOLERANCE


def test_genai_config_and_processor_config_are_what_og_reads(lfm2_vl_bundle):
    config = json.loads((lfm2_vl_bundle / "genai_config.json").read_text())["model"]
    assert config["type"] == "lfm2_vl"
    vision = config["vision"]
    assert vision["inputs"] == {
        "pixel_values": "pixel_values",
        "attention_mask": "pixel_attention_mask",
        "image_sizes": "spatial_shapes",
    }
    assert (vision["patch_size"], vision["spatial_merge_size"]) == (4, 2)
    assert config["decoder"]["layer_types"] == ["conv", "full_attention", "conv"]
    processor = json.loads((lfm2_vl_bundle / vision["config_filename"]).read_text())
    transforms = [t["operation"] for t in processor["processor"]["transforms"]]
    assert [t["type"] for t in transforms] == [
        "DecodeImage",
        "Resize",
        "Rescale",
        "Normalize",
        "Permute3D",
        "PixtralImageSizes",
    ]
    assert transforms[0]["attrs"] == {"color_space": "RGB"}  # no ConvertRGB: RGB reaches the tower
    resize = transforms[1]["attrs"]
    assert (resize["min_pixels"], resize["max_pixels"]) == (4 * 64, 16 * 64)
    assert (resize["patch_size"], resize["merge_size"], resize["interpolation"]) == (4, 2, "LINEAR")
    validate_bundle(lfm2_vl_bundle)


@pytest.mark.parametrize("size", [SIZES[0], (24, 32)])
def test_og_greedy_tokens_with_an_image_equal_transformers(
    lfm2_vl_checkpoint, lfm2_vl_bundle, tmp_path, size
):
    """og's processor gives transformers' patches and the image's patch grid, expands
    <image> to <|image_start|>, one <image> per token, <|image_end|> (the processor's
    layout without tiling), and og's greedy tokens equal transformers'."""
    model, _ = lfm2_vl_checkpoint
    pixels = _pixels(*size, seed=0)
    path = tmp_path / "image.png"
    path.write_bytes(png_bytes(pixels))
    og_model = og.Model(str(lfm2_vl_bundle))
    inputs = og_model.create_multimodal_processor()(
        "<image> Describe.", images=og.Images.open(str(path))
    )
    expected = image_inputs([pixels])
    patches = inputs["pixel_values"].as_numpy()
    count = expected["spatial_shapes"].prod()
    np.testing.assert_allclose(patches, expected["pixel_values"][:, :count], atol=1e-5)
    np.testing.assert_array_equal(inputs["image_sizes"].as_numpy(), expected["spatial_shapes"])
    ids = inputs["input_ids"].as_numpy().astype(np.int64)
    tokenizer = og.Tokenizer(og_model)
    image = model.config.image_token_id
    start, end = (int(tokenizer.encode(t)[-1]) for t in ("<|image_start|>", "<|image_end|>"))
    tokens = image_tokens(pixels)
    assert ids[0, : tokens + 2].tolist() == [start, *[image] * tokens, end]
    assert og_greedy(og_model, inputs, 6) == transformers_tokens(
        model, torch.from_numpy(ids), pixels, 6
    )


def test_smoke_test_and_run_with_an_image(lfm2_vl_bundle, tmp_path, capsys):
    result = smoke_test(lfm2_vl_bundle, get_ep("cpu"))
    assert result.ran
    assert result.note.endswith("with a 16x16 image, same as a plain onnxruntime loop")
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(_pixels(16, 24)))
    command = ["run", str(lfm2_vl_bundle), "--image", str(path), "--prompt", "Describe it."]
    assert main([*command, "--raw", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()


def _two_images(tmp_path, first, second) -> og.Images:
    paths = []
    for name, pixels in (("a.png", first), ("b.png", second)):
        paths.append(str(tmp_path / name))
        (tmp_path / name).write_bytes(png_bytes(pixels))
    return og.Images.open(*paths)


def test_og_greedy_tokens_with_two_images_equal_transformers(
    lfm2_vl_checkpoint, lfm2_vl_bundle, tmp_path
):
    """Two images of one size: one vision run over both, each placed at its <image>."""
    model, _ = lfm2_vl_checkpoint
    first, second = _pixels(16, 24, seed=0), _pixels(16, 24, seed=1)
    og_model = og.Model(str(lfm2_vl_bundle))
    inputs = og_model.create_multimodal_processor()(
        "<image> and <image> Compare.", images=_two_images(tmp_path, first, second)
    )
    assert inputs["pixel_values"].as_numpy().shape[0] == 2
    ids = torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))
    feeds = {key: torch.from_numpy(value) for key, value in image_inputs([first, second]).items()}
    assert og_greedy(og_model, inputs, 6) == generated_tokens(model, ids, 6, **feeds)


def test_og_refuses_images_of_different_sizes_in_one_prompt(lfm2_vl_bundle, tmp_path):
    """og 0.18's processor stacks the resized images in one batch: two sizes fail there (the
    vision graph itself takes them: test_vision_graph_matches_transformers)."""
    processor = og.Model(str(lfm2_vl_bundle)).create_multimodal_processor()
    images = _two_images(tmp_path, _pixels(16, 24), _pixels(24, 16))
    with pytest.raises(RuntimeError, match="Lfm2VlImageProcessor: image_sizes reports"):
        processor("<image> and <image> Compare.", images=images)


def test_int4_bundle_quantizes_the_decoder_and_generates_with_an_image(
    lfm2_vl_checkpoint, tmp_path, capfd
):
    """int4: the decoder's projections in MatMulNBits, the tower float; the smoke test (og with
    an image, against a plain onnxruntime loop) passes."""
    bundle = package(lfm2_vl_checkpoint[1], "cpu", tmp_path / "bundle", precision="int4")
    ops = {
        key: {node.op_type for node in onnx.load(str(bundle / f"{key}.onnx")).graph.node}
        for key in ("vision", "decoder")
    }
    assert "MatMulNBits" in ops["decoder"] and "MatMulNBits" not in ops["vision"]
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert manifest["build"]["precision"] == "int4"
    assert "with a 16x16 image, same as a plain onnxruntime loop" in capfd.readouterr().err


def test_hub_names_of_the_tower_are_read(lfm2_vl, tmp_path):
    """Hub checkpoints written before transformers 5 keep the tower under
    model.vision_tower.vision_model.: the same features."""
    model, folder = lfm2_vl
    hub = tmp_path / "hub"
    shutil.copytree(folder, hub)
    tensors = load_file(hub / "model.safetensors")
    renamed = {
        name.replace("model.vision_tower.", "model.vision_tower.vision_model."): tensor
        for name, tensor in tensors.items()
    }
    save_file(renamed, hub / "model.safetensors", metadata={"format": "pt"})
    inputs = image_inputs([_pixels(*SIZES[0])])
    vision = package_sessions(build(hub, "cpu", "fp32", progress=False))["vision"]
    expected = reference_features(model, inputs)
    np.testing.assert_allclose(vision.run(None, inputs)[0], expected, atol=TOLERANCE, rtol=0)


def test_og_refuses_rewinding_and_the_bundle_says_so(lfm2_vl_bundle):
    """og 0.18 runs lfm2_vl with LFM2's state cache, which cannot rewind its conv states."""
    assert "RewindTo" in bundle_og_limits(lfm2_vl_bundle)[REWIND]
    model = og.Model(str(lfm2_vl_bundle))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=20)
    generator = og.Generator(model, params)
    generator.append_tokens([[5, 6, 7, 8]])
    generator.generate_next_token()
    with pytest.raises(RuntimeError, match="RewindTo is currently not supported for lfm2_vl"):
        generator.rewind_to(2)
