"""Gemma 4 bundles: og's gemma4 pipeline (its Gemma4ImageTransform, vision, embedding and
decoder graphs) against transformers, with one and two images; the smoke test and
`run --image`."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime_genai as og
import pytest
import torch

from mobius_genai.build import build
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.cli import main
from mobius_genai.ep import get_ep
from mobius_genai.models import causal_lm
from mobius_genai.packager import package
from mobius_genai.quantize import weight_uses
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import png_bytes
from tests._gemma4_vision import (
    KEPT_SIZES,
    MAX_SOFT_TOKENS,
    POOL,
    image_inputs,
    image_tokens,
    kept_size,
    og_image_inputs,
    og_prefill_logits,
    prefill_logits,
    random_pixels,
    reference_features,
    reference_inputs,
)
from tests._hf import generated_tokens
from tests._ort import (
    assert_og_takes_tokens_as_transformers,
    assert_only_the_decoder_fuses_gqa,
    model_ops,
    og_greedy,
    package_sessions,
    saved_ops,
)

TOLERANCE = 1e-4
F16_TOLERANCE = 5e-2
TABLE = "model.embed_tokens_per_layer.weight"
TOKEN_TABLE = "model.embed_tokens.weight"
#: How much the tables' int4 rounding may add to an int4 bundle's mean error against
#: transformers (relative; the tiny model's token table has two blocks a row).
INT4_TABLE_DRIFT = 0.1


def test_genai_config_and_processor_config_are_what_og_reads(gemma4_bundle):
    config = json.loads((gemma4_bundle / "genai_config.json").read_text())["model"]
    assert config["type"] == "gemma4"
    vision = config["vision"]
    assert vision["inputs"] == {
        "pixel_values": "pixel_values",
        "pixel_position_ids": "pixel_position_ids",
    }
    assert config["speech"] == {"config_filename": ""}  # og's default names an audio file
    assert "input_ids" in config["decoder"]["inputs"]  # the per-layer rows read the token ids
    processor = json.loads((gemma4_bundle / vision["config_filename"]).read_text())
    transforms = [t["operation"] for t in processor["processor"]["transforms"]]
    assert [t["type"] for t in transforms] == ["DecodeImage", "Gemma4ImageTransform"]
    assert transforms[0]["attrs"] == {"color_space": "RGB"}  # no ConvertRGB: RGB reaches the tower
    assert transforms[1]["attrs"] == {
        "patch_size": 4,
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "pooling_kernel_size": POOL,
    }
    validate_bundle(gemma4_bundle)


@pytest.mark.parametrize("size", KEPT_SIZES)
def test_og_processor_gives_transformers_patches_and_prompt(gemma4_bundle, tmp_path, size):
    """At a size both processors keep: transformers' patches (RGB, [0, 1]) and (column, row)
    positions; og wraps the image's tokens in blank lines (transformers' processor does not:
    the comparisons feed transformers og's ids)."""
    pixels = random_pixels(*size)
    model, inputs = og_image_inputs(gemma4_bundle, tmp_path, [pixels])
    expected = image_inputs([pixels])
    np.testing.assert_allclose(
        inputs["pixel_values"].as_numpy(), expected["pixel_values"], atol=1e-6
    )
    np.testing.assert_array_equal(
        inputs["pixel_position_ids"].as_numpy(), expected["pixel_position_ids"]
    )
    tokenizer = og.Tokenizer(model)
    ids = inputs["input_ids"].as_numpy().reshape(-1).tolist()
    boi, image, eoi = (int(tokenizer.encode(t)[-1]) for t in ("<|image>", "<|image|>", "<image|>"))
    tokens = image_tokens(pixels)
    start = ids.index(boi)
    assert ids[start : start + tokens + 2] == [boi, *[image] * tokens, eoi]
    assert tokenizer.decode(ids[:start]) == "\n\n"


@pytest.mark.parametrize("size", [(24, 36), (200, 40)])
def test_og_resizes_an_image_to_transformers_size(gemma4_bundle, tmp_path, size):
    """An image at another size: og's transform picks transformers' target size (its patch
    grid), within the token budget."""
    _, inputs = og_image_inputs(gemma4_bundle, tmp_path, [random_pixels(*size)])
    height, width = kept_size(*size)
    positions = inputs["pixel_position_ids"].as_numpy().reshape(-1, 2)
    assert (positions[:, 0].max() + 1, positions[:, 1].max() + 1) == (width // 4, height // 4)
    assert len(positions) == (height // 4) * (width // 4) <= MAX_SOFT_TOKENS * POOL * POOL


@pytest.mark.parametrize("sizes", [[KEPT_SIZES[0]], [KEPT_SIZES[1], KEPT_SIZES[2]]])
def test_og_greedy_tokens_with_images_equal_transformers(
    gemma4_checkpoint, gemma4_bundle, tmp_path, sizes
):
    """One image, and two of different sizes: og's prefill logits are transformers' (fp32)
    and its greedy tokens equal transformers'."""
    model, _ = gemma4_checkpoint
    pixels = [random_pixels(*size, seed=i) for i, size in enumerate(sizes)]
    og_model, inputs = og_image_inputs(gemma4_bundle, tmp_path, pixels)
    ids = inputs["input_ids"].as_numpy().astype(np.int64)
    assert (ids == model.config.image_token_id).sum() == sum(map(image_tokens, pixels))
    ours = og_prefill_logits(og_model, inputs)
    with torch.no_grad():
        expected = model(**reference_inputs(model, ids, pixels, blocks=False)).logits.numpy()
    # every position of a 3-layer prefill over ~80-150 tokens: logits up to ~9 agree to 2e-4
    # (2e-5 of their size); the vision and embedding graphs alone hold 1e-4
    np.testing.assert_allclose(ours, expected, atol=2 * TOLERANCE, rtol=0)
    reference = reference_inputs(model, ids, pixels, blocks=False)
    theirs = generated_tokens(model, reference.pop("input_ids"), 6, **reference)
    assert og_greedy(og_model, inputs, 6) == theirs


def test_soft_tokens_reading_their_own_per_layer_rows_fail(gemma4_checkpoint, monkeypatch):
    """The mutant: the decoder reads the image tokens' own rows of the per-layer table, not the
    pad token's (transformers' Gemma4Model.forward); the prefill logits move past the
    tolerance."""
    model, folder = gemma4_checkpoint
    section_of = causal_lm.PerLayerTextModel._per_layer_inputs

    def own_rows(self, op, input_ids, embeds):
        return causal_lm.per_layer_inputs(op, self, self.config.per_layer_stack, input_ids, embeds)

    pixels = [random_pixels(*KEPT_SIZES[1])]
    features_of = image_inputs(pixels)
    tokens = image_tokens(pixels[0])
    ids = np.array([[2, 5, *[model.config.image_token_id] * tokens, 7, 8]], np.int64)
    with torch.no_grad():
        expected = model(**reference_inputs(model, ids, pixels, blocks=False)).logits.numpy()
    errors = []
    for forward in (section_of, own_rows):
        monkeypatch.setattr(causal_lm.PerLayerTextModel, "_per_layer_inputs", forward)
        logits = prefill_logits(build(folder, "cpu", "fp32", progress=False), ids, features_of)
        errors.append(float(np.abs(logits - expected).max()))
    assert errors[0] < TOLERANCE < 100 * TOLERANCE < errors[1]


def test_smoke_test_and_run_with_an_image(gemma4_bundle, tmp_path, capsys):
    result = smoke_test(gemma4_bundle, get_ep("cpu"))
    assert result.ran
    assert result.note.endswith("with a 96x96 image, same as a plain onnxruntime loop")
    path = tmp_path / "photo.png"
    path.write_bytes(png_bytes(random_pixels(40, 60)))
    command = ["run", str(gemma4_bundle), "--image", str(path), "--prompt", "Describe it."]
    assert main([*command, "--raw", "--max-new-tokens", "4"]) == 0
    assert "mobius-genai: 4 tokens" in capsys.readouterr().err  # the tiny model's text: blanks


@pytest.mark.parametrize("ep", ["cpu", "cuda", "onnx-standard"])
def test_graph_ops_per_ep_and_role(gemma4_checkpoint, ep):
    """The tower's attention is bidirectional over the image's patches: standard Attention on
    every EP; the decoder's GroupQueryAttention where the EP has it; onnx-standard: every graph
    in the standard domain."""
    _, folder = gemma4_checkpoint
    package = build(folder, ep, load_weights=False, progress=False)
    assert_only_the_decoder_fuses_gqa(package, ep)
    assert {("", "Attention"), ("", "Compress")} <= model_ops(package["vision"])
    fused = ("com.microsoft", "GroupQueryAttention") in model_ops(package["decoder"])
    assert fused == (ep != "onnx-standard")


def test_the_cuda_vision_graph_runs_on_the_cpu_kernel_like_transformers(gemma4_checkpoint):
    """cuda's float16 vision graph on onnxruntime's CPU kernels: the pooling, its sqrt(hidden)
    scale and the standardization in float32 keep the features of an image within float16's
    tolerance of transformers' (features up to ~4 in size)."""
    model, folder = gemma4_checkpoint
    sessions = package_sessions(build(folder, "cuda", progress=False))
    inputs = image_inputs([random_pixels(*KEPT_SIZES[0], seed=1)])
    feeds = {**inputs, "pixel_values": inputs["pixel_values"].astype(np.float16)}
    (features,) = sessions["vision"].run(None, feeds)
    assert features.dtype == np.float16
    expected = reference_features(model, inputs)
    np.testing.assert_allclose(features.astype(np.float32), expected, atol=F16_TOLERANCE, rtol=0)


def test_int4_bundle_quantizes_the_decoder_and_runs_with_an_image(gemma4_checkpoint, tmp_path):
    """int4: the decoder's projections become MatMulNBits, its per-layer table and the
    embedding graph's token table GatherBlockQuantized (read by the token ids, image tokens
    mapped to the pad row), the tower stays float, and the smoke test (og against a plain
    onnxruntime loop) runs with an image."""
    _, folder = gemma4_checkpoint
    bundle = package(folder, "cpu", tmp_path / "bundle", precision="int4", quiet=True)
    assert ("com.microsoft", "MatMulNBits") in saved_ops(bundle / "decoder.onnx")
    assert ("com.microsoft", "GatherBlockQuantized") in saved_ops(bundle / "decoder.onnx")
    assert TABLE not in _float_initializers(bundle / "decoder.onnx")
    assert saved_ops(bundle / "embedding.onnx") >= {("com.microsoft", "GatherBlockQuantized")}
    assert TOKEN_TABLE not in _float_initializers(bundle / "embedding.onnx")
    assert ("com.microsoft", "MatMulNBits") not in saved_ops(bundle / "vision.onnx")
    record = json.loads((bundle / "mobius_manifest.json").read_text())["build"]["smoke_test"]
    assert record["ran"] and "with a 96x96 image" in record["note"]


def _float_initializers(path) -> dict[str, int]:
    """The float initializers of a saved graph, name → bytes, its weights left unread."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {
        tensor.name: int(np.prod(tensor.dims)) * 4
        for tensor in graph.initializer
        if tensor.data_type == onnx.TensorProto.FLOAT
    }


def _bytes(bundle) -> int:
    """The bytes of a bundle's graphs and their weights."""
    return sum(path.stat().st_size for path in bundle.glob("*.onnx*"))


def test_int4_tables_against_the_float_tables_bundle(gemma4_checkpoint, tmp_path, monkeypatch):
    """The int4 bundle against one whose lookups by mapped ids stay float (as before: the
    decoder's per-layer table, the embedding graph's token table): the bundle is smaller by
    about the tables' float bytes less their int4 ones (4 bits and a float scale per block of
    32); og's greedy tokens with an image are the same, and the prefill logits' mean error
    against transformers grows by under 10% (the int4 projections' error is the bar)."""
    model, folder = gemma4_checkpoint
    bundles = {"int4": package(folder, "cpu", tmp_path / "int4", precision="int4", quiet=True)}
    monkeypatch.setattr(weight_uses, "_token_ids", lambda ids: ids.name == weight_uses.TOKEN_IDS)
    bundles["float tables"] = package(
        folder, "cpu", tmp_path / "float", precision="int4", quiet=True, smoke_test=False
    )
    tables = sum(
        _float_initializers(bundles["float tables"] / graph)[name]
        for graph, name in (("decoder.onnx", TABLE), ("embedding.onnx", TOKEN_TABLE))
    )
    saved = _bytes(bundles["float tables"]) - _bytes(bundles["int4"])
    assert 0.8 * tables * (1 - 5 / 32) < saved < tables
    pixels = [random_pixels(*KEPT_SIZES[0], seed=3)]
    logits, tokens = [], []
    for bundle in bundles.values():
        og_model, inputs = og_image_inputs(bundle, tmp_path, pixels)
        ids = inputs["input_ids"].as_numpy().astype(np.int64)
        logits.append(og_prefill_logits(og_model, inputs))
        tokens.append(og_greedy(og_model, inputs, 6))
    assert tokens[0] == tokens[1]
    assert not np.array_equal(*logits)  # the table's rounding reaches the logits
    with torch.no_grad():
        expected = model(**reference_inputs(model, ids, pixels, blocks=False)).logits.numpy()
    # the tiny random model's int4 projections alone move its logits ~28% on average
    errors = [np.abs(each - expected).mean() / np.abs(expected).mean() for each in logits]
    assert errors[0] < (1 + INT4_TABLE_DRIFT) * errors[1], errors


def test_og_takes_image_and_video_tokens_without_media_as_transformers_does(
    gemma4_checkpoint, gemma4_bundle
):
    """Gemma 4's image and video tokens with no image, in the prompt and as decode steps: the
    pad token's embedding and per-layer rows, as transformers gives them."""
    model = gemma4_checkpoint[0]
    image, video = model.config.image_token_id, model.config.video_token_id
    assert_og_takes_tokens_as_transformers(
        model, gemma4_bundle, [5, image, 6, video], [image, video]
    )
