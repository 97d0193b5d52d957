"""Ministral 3 (Ministral-3-3B/8B/14B-*-2512): Mistral 3's model_type with a `ministral3`
text_config. Its decoder is built by the ministral3 row (yarn rope, the position-dependent
query scale), not the mistral one: graphs (fp32, 1e-4) and og.Generator's greedy tokens with
an image equal transformers'; the same bundle without the scale does not. Other text decoders
are refused in one line."""

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
    image_tokens,
    pixel_values,
    reference_features,
    special_ids,
    transformers_tokens,
    write_mistral3_checkpoint,
)
from tests._ort import decode_like_transformers, og_greedy, package_sessions, run_declared

og = pytest.importorskip("onnxruntime_genai")

TOLERANCE = 1e-4
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16
SIZE = (24, 40)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ministral3-ckpt")
    return write_mistral3_checkpoint(folder, MINISTRAL3_TEXT), folder


def _pixels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (*SIZE, 3), dtype=np.uint8)


def _prompt(folder) -> torch.Tensor:
    """text, the image's tokens (the checkpoint tokenizer's [IMG] ids), text."""
    return torch.tensor([[1, 5, *image_tokens(*SIZE, special_ids(folder)), 7, 8, 9]])


def _decoder_logits(folder) -> tuple[object, dict]:
    graphs = package_sessions(build(folder, "cpu", "fp32", progress=False))
    ids = _prompt(folder)
    features = graphs["vision"].run(None, {"pixel_values": pixel_values(_pixels())})[0]
    embeds = run_declared(
        graphs["embedding"], {"input_ids": ids.numpy(), "image_features": features}
    )["inputs_embeds"]
    seq = ids.shape[1]
    empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    feeds = {
        "inputs_embeds": embeds,
        "input_ids": ids.numpy(),
        "attention_mask": np.ones((1, seq), np.int64),
        "position_ids": np.arange(seq)[None],
        **{
            f"past_key_values.{i}.{kind}": empty for i in range(LAYERS) for kind in ("key", "value")
        },
    }
    return graphs, run_declared(graphs["decoder"], feeds)


def _reference(model, folder):
    ids = _prompt(folder)
    with torch.no_grad():
        return model(
            input_ids=ids,
            pixel_values=torch.from_numpy(pixel_values(_pixels())),
            image_sizes=torch.tensor([list(SIZE)]),
            use_cache=True,
        )


def test_the_text_config_model_type_picks_the_decoder_row(checkpoint):
    _, folder = checkpoint
    raw = json.loads((folder / "config.json").read_text())
    assert raw["text_config"]["model_type"] == "ministral3"
    config = vision_language_family("mistral3").parse_config(raw)
    tuning = config.text.local_global.temperature
    assert (tuning.floor_scale, tuning.scale, tuning.every_layer) == (4.0, 0.5, True)
    assert config.text.rope.type == "yarn"
    row = vision_language_family("mistral3", raw)
    assert (row.text_family, row.genai_type) == ("ministral3", "mistral3")


def test_graphs_match_transformers_over_prefill_and_decode(checkpoint):
    """The prompt's 24 positions cross 5 steps of the query scale, the decode steps more."""
    model, folder = checkpoint
    reference = _reference(model, folder)
    image = int((_prompt(folder) == special_ids(folder)[0]).sum())
    assert image == len(reference_features(model, _pixels()))
    graphs, outputs = _decoder_logits(folder)
    np.testing.assert_allclose(outputs["logits"], reference.logits.numpy(), atol=TOLERANCE, rtol=0)
    decode_like_transformers(model, graphs, outputs, reference)


def test_a_decoder_without_the_query_scale_does_not_match(checkpoint, monkeypatch):
    model, folder = checkpoint
    row = FAMILIES["ministral3"]
    overrides = {**row.config_overrides, "local_global": None}
    monkeypatch.setitem(
        FAMILIES, "ministral3", dataclasses.replace(row, config_overrides=overrides)
    )
    outputs = _decoder_logits(folder)[1]
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
    """Mistral Large 3's text_config is deepseek_v3 (which transformers 5.25 builds without
    the query scale its rope dict names); none of mistral3's text rows."""
    _, folder = checkpoint
    raw = json.loads((folder / "config.json").read_text())
    raw["text_config"]["model_type"] = "deepseek_v3"
    with pytest.raises(UnsupportedModelError, match="accepted for mistral3") as error:
        vision_language_family("mistral3").parse_config(raw)
    message = str(error.value)
    assert "'deepseek_v3'" in message and "'ministral3'" in message and "\n" not in message
