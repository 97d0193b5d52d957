"""Mistral 3's model_type with another text decoder than Mistral's: Ministral 3
(Ministral-3-3B/8B/14B-*-2512, a `ministral3` text_config: yarn rope, the position-dependent
query scale) and Mistral Large 3 (a `deepseek_v3` text_config: latent attention, routed
experts). transformers builds text_config by its model_type; so does the mistral3 row, each by
its family row: graphs (fp32, 1e-4, the portable and cpu graphs) and og.Generator's greedy
tokens with an image equal transformers'; Ministral 3 without the scale does not. Other text
decoders are refused in one line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from mobius_genai import packager
from mobius_genai.build import build
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models import FAMILIES
from mobius_genai.models.vision_language import vision_language_family
from mobius_genai.runtime.smoke_image import png_bytes
from tests._mistral3 import (
    MINISTRAL3_TEXT,
    MISTRAL_LARGE3_TEXT,
    image_tokens,
    pixel_values,
    reference_features,
    special_ids,
    transformers_tokens,
    write_mistral3_checkpoint,
)
from tests._ort import (
    decode_like_transformers,
    og_greedy,
    package_sessions,
    prefill_feeds,
    run_declared,
)

og = pytest.importorskip("onnxruntime_genai")

TOLERANCE = 1e-4
SIZE = (24, 40)
TEXTS = {"ministral3": MINISTRAL3_TEXT, "deepseek_v3": MISTRAL_LARGE3_TEXT}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """text_config model_type → (model, folder), each written once."""
    written = {}

    def get(text_type: str) -> tuple:
        if text_type not in written:
            folder = tmp_path_factory.mktemp(f"mistral3-{text_type}")
            written[text_type] = write_mistral3_checkpoint(folder, TEXTS[text_type]), folder
        return written[text_type]

    return get


@pytest.fixture(params=sorted(TEXTS))
def checkpoint(request, checkpoints) -> tuple:
    return checkpoints(request.param)


def _pixels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (*SIZE, 3), dtype=np.uint8)


def _prompt(folder) -> torch.Tensor:
    """text, the image's tokens (the checkpoint tokenizer's [IMG] ids), text."""
    return torch.tensor([[1, 5, *image_tokens(*SIZE, special_ids(folder)), 7, 8, 9]])


def _prefill(folder, ep: str = "cpu") -> tuple[dict, dict]:
    """The graphs of `ep` and the decoder's outputs over the image prompt."""
    package = build(folder, ep, "fp32", progress=False)
    graphs = package_sessions(package)
    ids = _prompt(folder).numpy()
    features = graphs["vision"].run(None, {"pixel_values": pixel_values(_pixels())})[0]
    embeds = run_declared(graphs["embedding"], {"input_ids": ids, "image_features": features})
    feeds = prefill_feeds(package["decoder"], ids, inputs_embeds=embeds["inputs_embeds"])
    return graphs, run_declared(graphs["decoder"], feeds)


def _reference(model, folder):
    with torch.no_grad():
        return model(
            input_ids=_prompt(folder),
            pixel_values=torch.from_numpy(pixel_values(_pixels())),
            image_sizes=torch.tensor([list(SIZE)]),
            use_cache=True,
        )


def test_the_text_config_model_type_picks_the_decoder_row(checkpoint):
    _, folder = checkpoint
    raw = json.loads((folder / "config.json").read_text())
    text_type = raw["text_config"]["model_type"]
    row = vision_language_family("mistral3", raw)
    assert (row.text_family, row.genai_type) == (text_type, "mistral3")
    config = vision_language_family("mistral3").parse_config(raw)
    assert config.text.model_type == text_type
    if text_type == "ministral3":
        tuning = config.text.local_global.temperature
        assert (tuning.floor_scale, tuning.scale, tuning.every_layer) == (4.0, 0.5, True)
    else:
        assert config.text.latent_attention is not None and config.text.moe is not None


@pytest.mark.parametrize("ep", ["default", "cpu"])
def test_graphs_match_transformers_over_prefill_and_decode(checkpoint, ep):
    """The prompt's 24 positions cross 5 steps of Ministral 3's query scale, the decode steps
    more; Mistral Large 3's experts are read from the hub's per-expert tensors."""
    model, folder = checkpoint
    reference = _reference(model, folder)
    image = int((_prompt(folder) == special_ids(folder)[0]).sum())
    assert image == len(reference_features(model, _pixels()))
    graphs, outputs = _prefill(folder, ep)
    np.testing.assert_allclose(outputs["logits"], reference.logits.numpy(), atol=TOLERANCE, rtol=0)
    decode_like_transformers(model, graphs, outputs, reference)


def test_a_ministral3_decoder_without_the_query_scale_does_not_match(checkpoints, monkeypatch):
    model, folder = checkpoints("ministral3")
    row = FAMILIES["ministral3"]
    overrides = {**row.config_overrides, "local_global": None}
    monkeypatch.setitem(
        FAMILIES, "ministral3", dataclasses.replace(row, config_overrides=overrides)
    )
    outputs = _prefill(folder)[1]
    error = np.abs(outputs["logits"] - _reference(model, folder).logits.numpy()).max()
    assert error > 100 * TOLERANCE


def test_onnxruntime_genai_greedy_tokens_with_an_image_equal_transformers(checkpoint, tmp_path):
    model, folder = checkpoint
    bundle = packager.package(folder, "cpu", tmp_path / "bundle", quiet=True)
    genai = json.loads((bundle / "genai_config.json").read_text())["model"]
    assert genai["type"] == "mistral3"
    path = tmp_path / "image.png"
    path.write_bytes(png_bytes(_pixels()))
    og_model = og.Model(str(bundle))
    processor = og_model.create_multimodal_processor()
    inputs = processor("[INST][IMG] Describe.[/INST]", images=og.Images.open(str(path)))
    ids = inputs["input_ids"].as_numpy().reshape(-1).tolist()
    ours = og_greedy(og_model, inputs, 12)
    assert ours == transformers_tokens(model, torch.tensor([ids]), _pixels(), 12)


def test_other_text_decoders_are_refused_in_one_line(checkpoint):
    _, folder = checkpoint
    raw = json.loads((folder / "config.json").read_text())
    raw["text_config"]["model_type"] = "qwen2"
    with pytest.raises(UnsupportedModelError, match="accepted for mistral3") as error:
        vision_language_family("mistral3").parse_config(raw)
    message = str(error.value)
    assert "'qwen2'" in message and "'deepseek_v3'" in message and "\n" not in message
