"""`bench DIR --image [FILE]`: the first token after an image against the prompt without it."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime_genai as og
import pytest

from mobius_genai.cli import main
from mobius_genai.runtime.smoke_image import png_bytes, smoke_pixels
from tests._jpeg import jpeg_bytes

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def _prompt_tokens(bundle, image: bytes) -> int:
    processor = og.Model(str(bundle)).create_multimodal_processor()
    inputs = processor(f"{PLACEHOLDER} Describe the image.", images=og.Images.open_bytes(image))
    return inputs["input_ids"].as_numpy().shape[-1]


def _bench(capsys, *arguments: str) -> dict:
    command = ["bench", *arguments, "--rounds", "1", "--new-tokens", "3", "--json"]
    assert main(command) == 0
    return json.loads(capsys.readouterr().out)


def test_bench_image_times_a_generated_image_and_a_file(qwen2_5_vl_bundle, tmp_path, capsys):
    """Without a file, an image at the processor's size (32 x 32 here); with one, that file
    (a JPEG of 16 x 24 pixels): each prompt og's processor's, timed against the prompt alone."""
    result = _bench(capsys, str(qwen2_5_vl_bundle), "--image")
    generated = png_bytes(smoke_pixels(32, 32))
    assert (result["image"], result["width"], result["height"]) == (
        "a generated 32 x 32 image",
        32,
        32,
    )
    assert result["prompt_tokens"] == _prompt_tokens(qwen2_5_vl_bundle, generated)
    assert result["tokens"] == 3 and result["ttft_ms"] > 0 and result["text_ttft_ms"] > 0
    assert result["image_cost"] == pytest.approx(result["ttft_ms"] / result["text_ttft_ms"])

    jpeg = jpeg_bytes(np.random.default_rng(0).integers(0, 256, (2, 3, 3), dtype=np.uint8))
    path = tmp_path / "photo.jpg"
    path.write_bytes(jpeg)
    from_file = _bench(capsys, str(qwen2_5_vl_bundle), "--image", str(path))
    assert from_file["image"] == str(path) and from_file["width"] is None
    assert from_file["prompt_tokens"] == _prompt_tokens(qwen2_5_vl_bundle, jpeg)
    assert from_file["prompt_tokens"] != result["prompt_tokens"]


def test_bench_image_refusals_are_one_line(qwen2_5_vl_bundle, packaged, tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    cases = [
        ([str(packaged("cpu")), "--image"], "a text-only bundle (model.type 'qwen2'"),
        ([str(qwen2_5_vl_bundle), "--image", str(text)], "--image: not a PNG or JPEG image"),
        ([str(qwen2_5_vl_bundle), "--image", str(tmp_path / "no.png")], "not a file"),
        ([str(qwen2_5_vl_bundle), "--image", "--audio"], "--audio and --image"),
    ]
    for arguments, said in cases:
        assert main(["bench", *arguments]) == 1
        err = capsys.readouterr().err
        assert said in err and "accepted" in err and "Traceback" not in err, err
