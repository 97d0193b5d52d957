"""A Qwen2-VL bundle: onnxruntime-genai 0.18 has no qwen2_vl type, and its qwen2_5_vl one (the
processor, the 3-D mrope positions) is Qwen2-VL's for images; og's greedy tokens with an image
equal transformers'."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

import mobius_genai
from mobius_genai.ep import get_ep
from mobius_genai.runtime.smoke import smoke_test
from mobius_genai.runtime.smoke_image import SMOKE_IMAGE_TEXT, png_bytes
from tests._ort import assert_og_takes_tokens_as_transformers, og_greedy, smoke_image_prompt
from tests._qwen_vl import (
    patches,
    tiny_qwen2_vl,
    token_types,
    transformers_tokens,
    write_qwen2_5_vl_checkpoint,
)
from tests.models.test_qwen2_5_vl_bundle import (
    PLACEHOLDER,
    assert_og_greedy_tokens_equal_transformers,
)

og = pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2_vl-ckpt")
    return write_qwen2_5_vl_checkpoint(folder, tiny_qwen2_vl), folder


@pytest.fixture(scope="module")
def bundle(checkpoint, tmp_path_factory):
    """Packaged for cpu, the smoke test (with an image) included."""
    out = tmp_path_factory.mktemp("qwen2_vl-bundle") / "bundle"
    return mobius_genai.package(checkpoint[1], "cpu", out, quiet=True)


def test_genai_config_names_og_s_qwen2_5_vl_type_without_windows(bundle):
    config = json.loads((bundle / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen2_5_vl"
    vision = config["vision"]
    assert "window_size" not in vision  # og reads it only for its QNN pipeline's windows
    assert (vision["spatial_merge_size"], vision["patch_size"]) == (2, 4)
    assert vision["tokens_per_second"] == 1.0  # og's video positions: one step a temporal patch
    assert vision["inputs"] == {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}


def test_onnxruntime_genai_greedy_tokens_with_an_image_equal_transformers(
    checkpoint, bundle, tmp_path
):
    assert_og_greedy_tokens_equal_transformers(checkpoint[0], bundle, tmp_path)


def test_smoke_test_generates_with_an_image_like_transformers(checkpoint, bundle):
    result = smoke_test(bundle, get_ep("cpu"))
    assert result.ran and "with a 32x32 image" in result.note
    pixels, input_ids = smoke_image_prompt(bundle, PLACEHOLDER, 32)
    expected = transformers_tokens(checkpoint[0], input_ids, pixels, len(result.tokens))
    assert list(result.tokens) == expected


def test_og_takes_the_image_token_without_an_image_as_transformers_does(checkpoint, bundle):
    """A prompt holding the image token and no image, then the token as a decode step's."""
    image = checkpoint[0].config.image_token_id
    assert_og_takes_tokens_as_transformers(checkpoint[0], bundle, [5, image, 6, image], [image])


def test_og_generates_on_after_greedy_picks_the_image_token(checkpoint, bundle, tmp_path):
    """The report's case: after a prompt with an image, greedy decoding picks the image token
    (its lm_head row set along the prompt's last hidden state); og.Generator decodes on, with
    transformers' greedy tokens, the token embedded as text at the next step."""
    model, folder = copy.deepcopy(checkpoint[0]), checkpoint[1]
    image = model.config.image_token_id
    pixels, input_ids = smoke_image_prompt(bundle, PLACEHOLDER, 32)
    values, grid = (torch.from_numpy(array) for array in patches(pixels))
    with torch.no_grad():
        hidden = model.model(
            input_ids=input_ids,
            pixel_values=values,
            image_grid_thw=grid,
            mm_token_type_ids=token_types(input_ids, image),
        ).last_hidden_state[0, -1]
        model.lm_head.weight[image] = hidden * (100 / hidden.dot(hidden))
    picked = tmp_path / "checkpoint"
    shutil.copytree(folder, picked)
    model.save_pretrained(picked)
    picked_bundle = mobius_genai.package(picked, "cpu", tmp_path / "bundle", quiet=True)
    og_model = og.Model(str(picked_bundle))
    inputs = og_model.create_multimodal_processor()(
        f"{PLACEHOLDER} {SMOKE_IMAGE_TEXT}", images=og.Images.open_bytes(png_bytes(pixels))
    )
    expected = transformers_tokens(model, input_ids, pixels, 6)
    assert expected[0] == image
    assert og_greedy(og_model, inputs, 6) == expected
