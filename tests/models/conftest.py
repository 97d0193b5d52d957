"""Tiny Gemma 3 and Qwen2.5-VL checkpoints with a tokenizer and image processor settings, and
the Gemma 3 cpu bundle, shared by the tests of vision-language bundles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from mobius_genai.packager import package
from tests._qwen_vl import TINY_QWEN2, write_qwen2_5_vl_checkpoint
from tests._vlm import tiny_gemma3

IMAGE_SPECIALS = ["<start_of_image>", "<image_soft_token>", "<end_of_image>"]
SIZE = 64  # 16 x 16 patches of 4: og's Gemma 3 processor assumes 256 image tokens


@pytest.fixture(scope="session")
def gemma3_checkpoint(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    folder = tmp_path_factory.mktemp("gemma3-ckpt")
    tokenizer = AutoTokenizer.from_pretrained(TINY_QWEN2)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_SPECIALS})
    boi, image, eoi = tokenizer.convert_tokens_to_ids(IMAGE_SPECIALS)
    model = tiny_gemma3(
        image_tokens=256,
        image_size=SIZE,
        text={"vocab_size": len(tokenizer) + 4},
        image_token_index=image,
        boi_token_index=boi,
        eoi_token_index=eoi,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # Gemma3ImageProcessor's settings (saving it needs PIL, which tests do not install)
    preprocessor = {
        "image_processor_type": "Gemma3ImageProcessor",
        "size": {"height": SIZE, "width": SIZE},
        "rescale_factor": 1 / 255,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model, folder


@pytest.fixture(scope="session")
def gemma3_bundle(gemma3_checkpoint, tmp_path_factory) -> Path:
    """The checkpoint packaged for cpu without the smoke test (each test runs what it checks)."""
    out = tmp_path_factory.mktemp("gemma3-bundle") / "bundle"
    return package(gemma3_checkpoint[1], "cpu", out, quiet=True, smoke_test=False)


@pytest.fixture(scope="session")
def qwen2_5_vl_checkpoint(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    folder = tmp_path_factory.mktemp("qwen2_5_vl-ckpt")
    return write_qwen2_5_vl_checkpoint(folder), folder


@pytest.fixture(scope="session")
def qwen2_5_vl_bundle(qwen2_5_vl_checkpoint, tmp_path_factory) -> Path:
    """The checkpoint packaged for cpu without the smoke test (each test runs what it checks)."""
    out = tmp_path_factory.mktemp("qwen2_5_vl-bundle") / "bundle"
    return package(qwen2_5_vl_checkpoint[1], "cpu", out, quiet=True, smoke_test=False)
