"""Tiny random LFM2-VL checkpoints written by transformers (no download), and transformers'
side of the comparisons: image features and greedy tokens for images already at the size the
image processor keeps (smart_resize leaves a multiple of PATCH * DOWNSAMPLE within the token
bounds as it is)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, Lfm2VlConfig, Lfm2VlForConditionalGeneration

from tests._hf import generated_tokens, randomize_weights
from tests.conftest import TINY_QWEN2

TEXT_HIDDEN = 64
PATCH, DOWNSAMPLE, GRID = 4, 2, 4  # 4-pixel patches, 2 x 2 of them a token, a 4 x 4 grid
MAX_PATCHES = 64  # the padded patch axis: max_image_tokens (16) * DOWNSAMPLE²
MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
SPECIALS = ["<image>", "<|image_start|>", "<|image_end|>"]

_TEXT = {
    "model_type": "lfm2",
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 96,
    "block_auto_adjust_ff_dim": False,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["conv", "full_attention", "conv"],
    "conv_bias": True,
    "vocab_size": 160,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_VISION = {
    "model_type": "siglip2_vision_model",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "patch_size": PATCH,
    "num_patches": GRID * GRID,
    "vision_use_head": False,
}


def tiny_lfm2_vl(text: dict | None = None, **top: object) -> Lfm2VlForConditionalGeneration:
    """A seeded random Lfm2VlForConditionalGeneration (float32, eval mode); `text` overrides
    text_config keys, `top` the top-level ones."""
    settings = {"image_token_id": 150, "projector_hidden_size": 48, **top}
    config = Lfm2VlConfig(
        text_config={**_TEXT, **(text or {})},
        vision_config=_VISION,
        downsample_factor=DOWNSAMPLE,
        **settings,
    )
    model = Lfm2VlForConditionalGeneration(config).eval()
    randomize_weights(model, 0)
    return model


def write_lfm2_vl_checkpoint(folder: Path) -> Lfm2VlForConditionalGeneration:
    """A packageable tiny LFM2-VL checkpoint in `folder`: the model, tiny-qwen2's tokenizer
    with LFM2-VL's image tokens, and the image processor's settings (no tiling)."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_QWEN2)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    image = tokenizer.convert_tokens_to_ids("<image>")
    model = tiny_lfm2_vl(
        text={"vocab_size": len(tokenizer) + 4, "eos_token_id": tokenizer.eos_token_id},
        image_token_id=image,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    preprocessor = {  # Lfm2VlImageProcessor's settings (saving it needs torchvision)
        "image_processor_type": "Lfm2VlImageProcessorFast",
        "downsample_factor": DOWNSAMPLE,
        "encoder_patch_size": PATCH,
        "min_image_tokens": 4,
        "max_image_tokens": 16,
        "max_num_patches": MAX_PATCHES,
        "do_image_splitting": False,
        "resample": 2,
        "rescale_factor": 1 / 255,
        "image_mean": list(MEAN),
        "image_std": list(STD),
    }
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model


def image_inputs(pixels: list[np.ndarray], length: int = MAX_PATCHES) -> dict[str, np.ndarray]:
    """transformers' Lfm2VlImageProcessor on uint8 images [h, w, 3] already at their size:
    rescale, normalize, patches row by row ((py, px, channel) inside each), padded to `length`
    with their mask, and each image's patch rows and columns."""
    values, masks, shapes = [], [], []
    for image in pixels:
        height, width, _ = image.shape
        scaled = ((image / 255 - np.array(MEAN)) / np.array(STD)).astype(np.float32)
        rows, cols = height // PATCH, width // PATCH
        grid = scaled.reshape(rows, PATCH, cols, PATCH, 3).transpose(0, 2, 1, 3, 4)
        flat = grid.reshape(rows * cols, PATCH * PATCH * 3)
        padded = np.zeros((length, flat.shape[1]), np.float32)
        padded[: len(flat)] = flat
        values.append(padded)
        masks.append((np.arange(length) < len(flat)).astype(np.int64))
        shapes.append([rows, cols])
    return {
        "pixel_values": np.stack(values),
        "pixel_attention_mask": np.stack(masks),
        "spatial_shapes": np.array(shapes, np.int64),
    }


def reference_features(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """transformers' image features [tokens, text hidden] of every image in order."""
    with torch.no_grad():
        output = model.model.get_image_features(
            torch.from_numpy(inputs["pixel_values"]),
            torch.from_numpy(inputs["spatial_shapes"]),
            torch.from_numpy(inputs["pixel_attention_mask"]),
        )
    return torch.cat(output.pooler_output).numpy()


def image_tokens(image: np.ndarray) -> int:
    height, width, _ = image.shape
    return (height // PATCH // DOWNSAMPLE) * (width // PATCH // DOWNSAMPLE)


def transformers_tokens(
    model, input_ids: torch.Tensor, pixels: np.ndarray, new_tokens: int
) -> list[int]:
    """transformers' greedy tokens for `input_ids` and one image already at its size."""
    inputs = {key: torch.from_numpy(value) for key, value in image_inputs([pixels]).items()}
    return generated_tokens(model, input_ids, new_tokens, **inputs)
